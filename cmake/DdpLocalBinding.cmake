# ddp_bind_calls_locally(target): a shared library's calls to its own functions bind when it is
# linked, not through a PLT stub and a GOT entry at run time. Nothing interposes them, and a
# collective that runs after compute has evicted the caches pays for every line on that detour
# (bench/results/2026-11-25-fabric-cold-path.txt). Only functions: data such
# as function-local statics in inline functions stays unique across the process.
function(ddp_bind_calls_locally target)
  target_compile_options(${target} PRIVATE -fno-semantic-interposition)
  target_link_options(${target} PRIVATE -Wl,-Bsymbolic-functions)
endfunction()
