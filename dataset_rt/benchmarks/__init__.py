"""The input-pipeline benchmark behind ``python -m dataset_rt.run_benchmark`` (the same
modules, options and report as dataset-rt 0.4.8).

Needs the optional ``benchmark`` extra (``pip install 'dataset-rt-zig[benchmark]'``: torch,
pydantic-settings, psutil). Importing this package imports none of them, and
``import dataset_rt`` never imports this package. The submodules:

- ``dataset_rt.benchmarks.config``: ``BenchmarkConfig`` (the validated workload and its
  command-line options) and ``Topology`` (the rank identity torchrun provides);
- ``dataset_rt.benchmarks.resources``: peak RSS, threads, descriptors and processes of
  a rank and its loader workers;
- ``dataset_rt.benchmarks.distributed``: one rank's measurements and the JSON report.

See ``docs/benchmark.md``.
"""
