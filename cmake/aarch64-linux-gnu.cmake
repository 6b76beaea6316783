# CMake toolchain file: Debian's aarch64 Linux cross compiler (g++-aarch64-linux-gnu), for the
# static runner of Cortex-A Linux boards (family linux_aarch64, firmware/linux_aarch64).
#
#   cmake ... -DCMAKE_TOOLCHAIN_FILE=<repo>/cmake/aarch64-linux-gnu.cmake \
#             "-DDK_CPU_FLAGS=-march=armv8.2-a+dotprod+fp16;-mtune=cortex-a76"
#
# The CPU flags come only from the board file (cpu.flags), passed as DK_CPU_FLAGS; none is
# written here. Optional: -DDK_TOOLCHAIN_PREFIX=<path/prefix-> (default aarch64-linux-gnu-).

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DK_CPU_FLAGS)
  message(FATAL_ERROR "DK_CPU_FLAGS is not set: pass the board file's cpu.flags.")
endif()
# try_compile() projects re-read this file: hand them the flags and the prefix.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DK_CPU_FLAGS DK_TOOLCHAIN_PREFIX)

if(NOT DK_TOOLCHAIN_PREFIX)
  set(DK_TOOLCHAIN_PREFIX aarch64-linux-gnu-)
endif()
set(CMAKE_C_COMPILER ${DK_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${DK_TOOLCHAIN_PREFIX}g++)
set(CMAKE_ASM_COMPILER ${DK_TOOLCHAIN_PREFIX}gcc)

list(JOIN DK_CPU_FLAGS " " _dk_cpu_flags)
set(CMAKE_C_FLAGS_INIT "${_dk_cpu_flags}")
set(CMAKE_CXX_FLAGS_INIT "${_dk_cpu_flags}")
set(CMAKE_ASM_FLAGS_INIT "${_dk_cpu_flags}")

# Only the cross sysroot for libraries and headers; programs (flatc, python) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
