"""gpupace microbenchmarks, runnable from a checkout: `python -m bench --suite cpu|gpu|all`.

`harness` holds the timing loops, quantiles, machine description and result files; each
`cpu_*` / `gpu_*` module is one benchmark, a small setup function on the harness. Results go
to `bench/results/` as dated, hardware-named CSV, JSON, Markdown and PNG files.
"""
