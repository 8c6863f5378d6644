# Cross-builds ddprun and the library for arm64 (aarch64: AWS Graviton) on an x86-64 host, against
# the Debian bookworm arm64 root that scripts/prepare-arm64-sysroot makes:
#   cmake -S . -B build-arm64 -G Ninja -DDDP_WERROR=ON \
#         -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64.cmake
# The root is DDP_ARM64_SYSROOT (a cache variable, else the environment variable of that name,
# else /var/cache/ddprun/arm64-bookworm). Tests run under qemu-aarch64 through binfmt_misc, with
# QEMU_LD_PREFIX naming the root so that every process a test starts finds arm64 libraries.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

if(NOT DDP_ARM64_SYSROOT)
  if(DEFINED ENV{DDP_ARM64_SYSROOT})
    set(DDP_ARM64_SYSROOT "$ENV{DDP_ARM64_SYSROOT}")
  else()
    set(DDP_ARM64_SYSROOT /var/cache/ddprun/arm64-bookworm)
  endif()
endif()
set(DDP_ARM64_SYSROOT "${DDP_ARM64_SYSROOT}" CACHE PATH "The arm64 root to build against")
if(NOT EXISTS "${DDP_ARM64_SYSROOT}/.ddprun-arm64-ready")
  message(FATAL_ERROR "no arm64 root at ${DDP_ARM64_SYSROOT}: run scripts/prepare-arm64-sysroot "
                      "(as root), or set DDP_ARM64_SYSROOT to one it made")
endif()

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT "${DDP_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH "${DDP_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (libfabric, hiredis, ...) reads the root's .pc files and prefixes their paths.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${DDP_ARM64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${DDP_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${DDP_ARM64_SYSROOT}/usr/share/pkgconfig")

# ctest and gtest's test discovery run arm64 executables through this: env sets QEMU_LD_PREFIX,
# and binfmt_misc hands the executable to qemu-aarch64 (QEMU_CPU, when set, picks the CPU model).
set(CMAKE_CROSSCOMPILING_EMULATOR /usr/bin/env "QEMU_LD_PREFIX=${DDP_ARM64_SYSROOT}")
