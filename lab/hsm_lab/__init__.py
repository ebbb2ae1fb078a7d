"""hsm_lab: the book's lab beside the library ``hsm``.

The experiments behind every table and figure of the book (:mod:`hsm_lab.experiments`, run by
``python -m hsm run NAME``), the data sets and their loaders (:mod:`hsm_lab.data`), result files
with provenance (:mod:`hsm_lab.results`), the papers' numbers (:mod:`hsm_lab.paper`), the book's
verdicts (:mod:`hsm_lab.report`), ``reproduce`` (:mod:`hsm_lab.reproduce`) and the benchmarks
(:mod:`hsm_lab.bench`, :mod:`hsm_lab.bench_decoding`, with the output-layer factory the
experiments share in :mod:`hsm_lab.output_layers`).

The lab imports the library; the library never imports the lab.
"""
