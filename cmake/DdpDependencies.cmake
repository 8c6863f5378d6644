# Third-party packages, all from Debian (scripts/install-deps installs them).
find_package(Torch REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(Gloo REQUIRED)
# Debian's Gloo package names its library by an absolute path (/usr/lib/libgloo.so.0.5.0), which in
# a cross build (cmake/toolchains/aarch64.cmake) is the host's: point it into the sysroot.
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSROOT)
  foreach(property IMPORTED_LOCATION IMPORTED_LOCATION_NONE IMPORTED_LOCATION_RELEASE
                   IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_DEBUG)
    get_target_property(location gloo ${property})
    if(location AND NOT location MATCHES "^${CMAKE_SYSROOT}/" AND EXISTS "${CMAKE_SYSROOT}${location}")
      set_target_properties(gloo PROPERTIES ${property} "${CMAKE_SYSROOT}${location}")
    endif()
  endforeach()
endif()
find_package(ZLIB REQUIRED)
find_package(cxxopts REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)  # header-only, never a public dependency
# The etcd store backend (lib/src/store/etcd_backend.cpp) loads libcurl at run time (dlopen of
# libcurl.so.4), so that ddprun stays glibc-only: building needs curl's header alone.
find_path(DDP_CURL_INCLUDE_DIR curl/curl.h)
if(NOT DDP_CURL_INCLUDE_DIR)
  message(FATAL_ERROR "curl/curl.h not found: install libcurl4-openssl-dev (scripts/install-deps)")
endif()
if(DDP_WITH_FABRIC)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(LIBFABRIC REQUIRED IMPORTED_TARGET libfabric)
endif()

# Torch's config exposes a plain `torch` target; its include dirs are in TORCH_INCLUDE_DIRS.
if(NOT TARGET ddp_torch_deps)
  add_library(ddp_torch_deps INTERFACE)
  target_link_libraries(ddp_torch_deps INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(ddp_torch_deps SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
endif()
