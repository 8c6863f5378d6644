# ddp_bind_calls_locally(target): a shared library's calls to its own functions bind when it is
# linked, not through a PLT stub and a GOT entry at run time. Nothing interposes them, and a
# collective that runs after compute has evicted the caches pays for every line on that detour:
# with libddp and libddp_fabric bound so, a 4 KiB shm allreduce interleaved with c10d's ops went
# from 1.12 to 1.44 times the bare libfabric ring, 64 KiB from 1.13 to 1.24 (median ratios of 6
# alternating runs, bench/results/2026-11-25-fabric-cold-path.txt). Only functions: data such
# as function-local statics in inline functions stays unique across the process.
function(ddp_bind_calls_locally target)
  target_compile_options(${target} PRIVATE -fno-semantic-interposition)
  target_link_options(${target} PRIVATE -Wl,-Bsymbolic-functions)
endfunction()
