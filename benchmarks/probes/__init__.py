"""Probes: kernels and one-off measurements that back a number in the docs or reports, kept runnable
outside the installed packages (run from the repository root, ``python -m benchmarks.probes.<name>``).

* ``read_probe`` / ``read_roofline``  the fastest bare read of N bytes (the ``read`` rows of
  ``benchmarks.bench_hopper_decode``)
* ``mma_probe`` / ``probe_fp8_accumulation``  how exactly Hopper's fp8 MMAs add (``torch._scaled_mm`` and
  the warp-level ``mma.sync``)
* ``profile_hopper_decode``  one decode shape launched a few times: the target of Nsight Compute
* ``pipe_floors`` / ``phase_samples`` (with ``_ncu``)  instruction-count floors and per-phase warp samples
  from Nsight Compute
* ``fixed_cost``  a call's fixed cost and marginal bandwidth, fitted from ``bench_hopper_decode --csv`` runs
* ``helpers_host_time`` / ``helpers_writer_parts`` / ``helpers_nvfp4_profile``  the helper kernels' host time
  per call, where the prefill writer's time goes, and ``nvfp4_quantize``'s reductions and profile
"""
