# Cross-compiling eldr for aarch64 Linux with Debian's toolchain
# (gcc-aarch64-linux-gnu: the compiler and its C library under
# /usr/aarch64-linux-gnu) against a sysroot of Debian's arm64 library
# packages unpacked into a folder, not installed (scripts/cross-aarch64.sh
# makes it and runs the tests):
#
#   cmake -S . -B build-aarch64 -G Ninja \
#         -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DELDR_AARCH64_SYSROOT=$PWD/build-aarch64/sysroot
#
# ctest runs each test program under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR)
# with the sysroot as its library prefix: correctness on Arm, not its speed.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(ELDR_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${ELDR_CROSS_TRIPLE}-gcc)

# the sysroot reaches the try_compile projects CMake makes while configuring
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ELDR_AARCH64_SYSROOT)
if(NOT ELDR_AARCH64_SYSROOT AND DEFINED ENV{ELDR_AARCH64_SYSROOT})
  set(ELDR_AARCH64_SYSROOT "$ENV{ELDR_AARCH64_SYSROOT}")
endif()
if(NOT ELDR_AARCH64_SYSROOT OR NOT IS_DIRECTORY "${ELDR_AARCH64_SYSROOT}/usr/include")
  message(FATAL_ERROR "ELDR_AARCH64_SYSROOT ('${ELDR_AARCH64_SYSROOT}') is not a sysroot of arm64 "
                      "packages: make one with scripts/cross-aarch64.sh")
endif()
set(ELDR_AARCH64_SYSROOT "${ELDR_AARCH64_SYSROOT}" CACHE PATH "arm64 packages unpacked (scripts/cross-aarch64.sh)")
set(_s "${ELDR_AARCH64_SYSROOT}")
set(_lib "${_s}/usr/lib/${ELDR_CROSS_TRIPLE}")

# The packages' headers and libraries beside the toolchain's own C library
# (the compiler keeps its default sysroot; this one only adds to it). The
# run path lets the test programs find the libraries without an environment.
set(CMAKE_C_FLAGS_INIT "-isystem ${_s}/usr/include -isystem ${_s}/usr/include/${ELDR_CROSS_TRIPLE}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-L${_lib} -Wl,-rpath-link,${_lib} -Wl,-rpath,${_lib}")

# Libraries and headers only from the toolchain and the sysroot, never from
# the build machine (whose /usr/lib/aarch64-linux-gnu may hold arm64 packages
# of another version); programs (pkg-config, the shell) from the build machine.
set(CMAKE_FIND_ROOT_PATH /usr/${ELDR_CROSS_TRIPLE} ${_s})
set(CMAKE_LIBRARY_ARCHITECTURE ${ELDR_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config reads the sysroot's .pc files and prefixes their paths with it
set(ENV{PKG_CONFIG_LIBDIR} "${_lib}/pkgconfig:${_s}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${_s}")
set(ENV{PKG_CONFIG_PATH} "")

# qemu-user with the sysroot as the prefix of every absolute path the program
# opens (the dynamic loader, the C library: scripts/cross-aarch64.sh links the
# toolchain's into it); its full path, since some tests run eldr with a bare PATH
find_program(ELDR_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${ELDR_QEMU_AARCH64} -L ${_s})
