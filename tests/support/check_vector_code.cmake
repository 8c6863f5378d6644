# cmake -DOBJDUMP=<objdump> -DOBJECTS=<object files> -DPATTERN=<regex> -DMIN=<count>
#       -DWHAT=<description> -P check_vector_code.cmake
# Fails unless the objects' disassembly holds at least MIN instructions matching PATTERN: each
# kernel variant's loops must really be vector code of its instruction set, so that a lost
# -march or optimisation flag cannot fall back to scalar loops silently.
set(count 0)
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND ${OBJDUMP} -d --no-show-raw-insn ${object}
                  OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${OBJDUMP} failed on ${object}")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(first "")
  foreach(line IN LISTS lines)
    if(line MATCHES "${PATTERN}")
      math(EXPR count "${count} + 1")
      if(first STREQUAL "")
        set(first "${line}")
      endif()
    endif()
  endforeach()
  message(STATUS "${object}: first match: ${first}")
endforeach()
if(count LESS MIN)
  message(FATAL_ERROR "${WHAT}: ${count} instructions match '${PATTERN}', expected at least "
                      "${MIN}; the kernels were not compiled as vector code of their "
                      "instruction set (check the -march and -O flags in lib/CMakeLists.txt)")
endif()
message(STATUS "${WHAT}: ${count} vector instructions")
