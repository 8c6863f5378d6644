# Third-party packages, all from Debian (scripts/install-deps installs them).
find_package(Torch REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
# Debian's Gloo package names its library by an absolute host path (/usr/lib/libgloo.so.0.5.0) and
# checks that the file exists: in a cross build (cmake/toolchains/aarch64.cmake) that is the host's
# own library, or nothing on a machine without one (the image's cross builder), so the same
# imported target is made here from the sysroot's files.
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSROOT)
  find_library(DDP_GLOO_LIBRARY NAMES gloo REQUIRED)
  find_path(DDP_GLOO_INCLUDE_DIR gloo/config.h REQUIRED)
  add_library(gloo SHARED IMPORTED)
  set_target_properties(gloo PROPERTIES IMPORTED_LOCATION "${DDP_GLOO_LIBRARY}"
                                        IMPORTED_SONAME libgloo.so.0
                                        INTERFACE_INCLUDE_DIRECTORIES "${DDP_GLOO_INCLUDE_DIR}")
else()
  find_package(Gloo REQUIRED)
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
# The join handshake's HMAC-SHA256 and nonces (lib/src/store/join_auth.cpp): libcrypto, shared
# for the library, and its static archive for ddprun, which needs nothing but glibc.
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)
find_library(DDP_LIBCRYPTO_STATIC NAMES libcrypto.a)
if(NOT DDP_LIBCRYPTO_STATIC)
  message(FATAL_ERROR "libcrypto.a not found: install libssl-dev (scripts/install-deps)")
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
