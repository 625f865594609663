"""What tests, benchmarks and users' own tests share (no test framework imported here):
synthetic run logs (`synthetic`), text snapshots of the TUI (`textshot`), rule cases as data
(`rulecases`), the CUDA stand-in (`cudasim`), a fake FSDP2 (`fakefsdp2`), hostile files
(`hostile`), a simulated monitor (`simmonitor`), and the GPU check's parts: the model and
slow link it trains (`gpusetup`), its profiler-trace witness (`tracewitness`) and its
synchronisation counter (`syncwatch`). Found by the device run's `PYTHONPATH=.` as well."""
