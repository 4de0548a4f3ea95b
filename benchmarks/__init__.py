"""Benchmarks: autofit against the batch-size finders users would reach for instead (`make bench`).

Not part of the package nor of `make test`; see benchmarks/README.md.
"""
