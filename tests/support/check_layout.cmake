cmake_minimum_required(VERSION 3.25)
# cmake -DSOURCE_DIR=<repo> -P check_layout.cmake
# The tests mirror the code: tests/lib/X/y_test.cpp tests lib/src/X/y.cpp (or y.h), and
# tests/launcher/X/y_test.cpp tests launcher/X/y.cpp. A test of a whole folder's behaviour, rather
# than one file's, is listed below with what it covers. Prints the sources no test names yet.
# path=the units it covers (lib/src/ or launcher/ relative, without .cpp); a test of one unit that
# also covers others (its per-instruction-set variants, say) is listed the same way.
set(folder_tests
  "lib/comm/reduce_kernels_test.cpp=comm/reduce_kernels_avx2 comm/reduce_kernels_avx512 comm/reduce_kernels_sve comm/reduce_kernels_baseline comm/reduce_kernels_float16 base/cpu_features"
  "lib/models/activation_kernels_test.cpp=models/activation_kernels_avx512 models/activation_kernels_sve models/activation_kernels_baseline"
  "lib/store/server_test.cpp=store/wire store/server_queries"
  "lib/base/env_test.cpp=base/env_vars"
  "lib/store/store_test.cpp=net/tcp_probe store/tcp_backend"
  "lib/store/etcd_backend_test.cpp=store/etcd_curl"
  "lib/comm/backend_loading_test.cpp=comm/factory comm/fabric_module comm/signal_dispositions"
  "lib/comm/collectives/collectives_test.cpp=comm/collectives/barrier comm/collectives/broadcast comm/collectives/direct comm/collectives/recursive_doubling comm/collectives/ring comm/collectives/peer_transport"
  "lib/comm/fabric/connection_parts_test.cpp=comm/fabric/provider_selection comm/fabric/host_identity comm/fabric/address_exchange comm/fabric/peer_liveness comm/fabric/proc_stat comm/fabric/shm_region_names"
  "lib/data/data_corruption_test.cpp=data/compressed_reader data/mnist data/cifar10"
  "lib/data/dataset_loader_test.cpp=data/mnist data/cifar10 data/image_dataset"
  "lib/models/models_test.cpp=models/mnist_cnn models/cifar_cnn models/resnet models/model_spec models/fused_activations models/mixed_precision_linear")
# Multi-process tests are not held to the layout; those named here count for the units they
# cover in the report.
set(multiprocess_tests
  "multiprocess/comm/conformance_test.cpp=comm/communicator comm/transport_communicator comm/types"
  "multiprocess/comm/gloo_backend_test.cpp=comm/gloo/gloo_communicator comm/gloo/gloo_device comm/gloo/gloo_direct_exchange comm/gloo/gloo_payload_exchange comm/gloo/gloo_peer_transport comm/gloo/gloo_store_bridge"
  "multiprocess/comm/init_process_group_test.cpp=comm/distributed"
  "multiprocess/fabric/fabric_process_test.cpp=comm/fabric/fabric_communicator comm/fabric/fabric_connection comm/fabric/fabric_endpoint comm/fabric/fabric_info comm/fabric/fabric_transport comm/fabric/fabric_transport_agreement comm/fabric/fabric_transport_liveness comm/fabric/fabric_transport_teardown comm/fabric/cross_memory_attach comm/fabric/module_entry_point"
  "multiprocess/parallel/distributed_data_parallel_test.cpp=parallel/distributed_data_parallel parallel/tensor_buffer"
  "multiprocess/train/trainer_test.cpp=train/trainer train/evaluation"
  "multiprocess/launcher/launcher_process_test.cpp=launcher/agent launcher/config/command_line launcher/diagnosis/failure_report launcher/config/host_facts launcher/main launcher/supervision/signal_inbox launcher/rendezvous/store_rendezvous launcher/supervision/supervisor launcher/supervision/worker_output launcher/supervision/worker_process"
  "multiprocess/launcher/netns_pods_test.cpp=launcher/config/kubernetes launcher/doctor/doctor launcher/doctor/allreduce_sweep"
  "multiprocess/launcher/hang_process_test.cpp=launcher/diagnosis/hang_watch")
set(allowed "")
set(covered "")
foreach(entry IN LISTS folder_tests multiprocess_tests)
  string(REGEX REPLACE "=.*" "" path "${entry}")
  string(REGEX REPLACE "^[^=]*=" "" units "${entry}")
  string(REPLACE " " ";" units "${units}")
  list(APPEND allowed "${path}")
  foreach(unit IN LISTS units)
    if(unit MATCHES "^launcher/")
      list(APPEND covered "${unit}")
    else()
      list(APPEND covered "lib/${unit}")
    endif()
  endforeach()
endforeach()

set(errors "")
set(tested "")
foreach(area IN ITEMS lib launcher)
  if(area STREQUAL "lib")
    set(code_root "${SOURCE_DIR}/lib/src")
  else()
    set(code_root "${SOURCE_DIR}/launcher")
  endif()
  file(GLOB_RECURSE tests RELATIVE "${SOURCE_DIR}/tests" "${SOURCE_DIR}/tests/${area}/*_test.cpp")
  foreach(test IN LISTS tests)
    string(REGEX REPLACE "^${area}/" "" relative "${test}")
    string(REGEX REPLACE "_test\\.cpp$" "" unit "${relative}")
    if(EXISTS "${code_root}/${unit}.cpp" OR EXISTS "${code_root}/${unit}.h")
      list(APPEND tested "${area}/${unit}")
    elseif(NOT test IN_LIST allowed)
      list(APPEND errors "tests/${test}: no ${code_root}/${unit}.cpp or .h to test; move it to "
                         "the path that mirrors its unit, or list it in check_layout.cmake")
    endif()
  endforeach()
endforeach()
foreach(path IN LISTS allowed)
  if(NOT EXISTS "${SOURCE_DIR}/tests/${path}")
    list(APPEND errors "check_layout.cmake lists tests/${path}, which does not exist")
  endif()
endforeach()
foreach(unit IN LISTS covered)
  string(REGEX REPLACE "^lib/" "lib/src/" file "${unit}")
  if(NOT EXISTS "${SOURCE_DIR}/${file}.cpp")
    list(APPEND errors "check_layout.cmake names ${unit}, which has no ${file}.cpp")
  endif()
endforeach()

# Nothing outside the known folders: a test added elsewhere would escape the layout.
file(GLOB top RELATIVE "${SOURCE_DIR}/tests" "${SOURCE_DIR}/tests/*")
foreach(entry IN LISTS top)
  if(IS_DIRECTORY "${SOURCE_DIR}/tests/${entry}" AND NOT entry MATCHES
     "^(lib|launcher|multiprocess|support|deploy|interop|consumer|bench|arm64|lint)$")
    list(APPEND errors "tests/${entry}/: not a folder of the layout (see tests/CMakeLists.txt)")
  endif()
endforeach()

# The report: sources with a test of their own, those covered only by a folder's or a
# multi-process test, and those no test names.
set(by_folder "")
set(untested "")
foreach(area IN ITEMS lib launcher)
  if(area STREQUAL "lib")
    file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}/lib/src" "${SOURCE_DIR}/lib/src/*.cpp")
  else()
    file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}/launcher" "${SOURCE_DIR}/launcher/*.cpp")
  endif()
  foreach(source IN LISTS sources)
    string(REGEX REPLACE "\\.cpp$" "" unit "${source}")
    if("${area}/${unit}" IN_LIST tested)
    elseif("${area}/${unit}" IN_LIST covered)
      list(APPEND by_folder "${area}/${unit}")
    else()
      list(APPEND untested "${area}/${unit}")
    endif()
  endforeach()
endforeach()
list(LENGTH tested tested_count)
list(LENGTH by_folder folder_count)
list(LENGTH untested untested_count)
string(REPLACE ";" " " untested_text "${untested}")
if(untested)
  set(untested_text ": ${untested_text}")
endif()
message(STATUS "${tested_count} units have a test at their mirrored path, ${folder_count} are "
               "covered by a folder's or a multi-process test, ${untested_count} by none of "
               "their own${untested_text}")
if(errors)
  string(REPLACE ";" "\n  " errors "${errors}")
  message(FATAL_ERROR "tests/ does not mirror the code:\n  ${errors}")
endif()
