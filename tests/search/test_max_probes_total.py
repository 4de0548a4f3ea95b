"""``--max-probes`` is the study's total (issue 35, item 5): it counted only the current run, so running a finished
search again spent N more probes and could change the answer. A resumed search with nothing new to learn spends
nothing; a higher limit spends only the difference."""

from test_predictive_search import SmallBatchFastRunner, refined, search

from autofit.core._options import FIELDS


def test_a_finished_search_run_again_spends_nothing(tmp_path):
    first, first_runner = refined(tmp_path, max_probes=4)  # refinement stops at the limit
    assert first.probe_limit_reached or len(first_runner.calls) >= 4
    again, again_runner = refined(tmp_path, max_probes=4)
    assert again_runner.calls == []
    assert again.chosen.candidate.key() == first.chosen.candidate.key()


def test_a_walk_stopped_by_the_limit_stays_stopped_on_resume(tmp_path):
    first, first_runner = search(tmp_path, 150, max_probes=2)  # the walk alone needs 3 probes here
    assert first_runner.calls
    again, again_runner = search(tmp_path, 150, max_probes=2)
    assert again_runner.calls == []  # its probes and its verification are stored
    assert (again.chosen is None) == (first.chosen is None)
    if first.chosen is not None:
        assert again.chosen.candidate.key() == first.chosen.candidate.key()


def test_a_higher_limit_spends_only_the_difference(tmp_path):
    refined(tmp_path, max_probes=4)
    _, more = refined(tmp_path, max_probes=6, runner_class=SmallBatchFastRunner)
    assert len(more.calls) <= 2


def test_the_help_says_it_is_the_studys_total():
    help_text = FIELDS["max_probes"].metadata["help"]
    assert "total" in help_text and "spends nothing" in help_text
