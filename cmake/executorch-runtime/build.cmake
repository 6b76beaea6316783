# Build step of the cached ExecuTorch runtime (run by the firmware build, see
# cmake/ExecuTorchRuntime.cmake):
#
#   cmake -DDK_RT_DIR=<runtime build dir> -DDK_RT_TARGETS=a,b,c
#         [-DDK_FLATC_DIR=<shared host-flatc dir> -DDK_FLATBUFFERS_SOURCE_DIR=<flatbuffers>
#          -DDK_GENERATOR=<generator for it> -DDK_MAKE_PROGRAM=<its build tool>]
#         -P build.cmake
#
# 1. The host flatc (needed to generate the program schema headers) is built once per
#    ExecuTorch source tree in DK_FLATC_DIR and shared by every runtime directory; it is about
#    two thirds of a cold runtime build.
# 2. The named targets of the runtime directory are built.
# Each step holds a lock, so firmware builds sharing the cache never run two builds in the
# same directory at once.
cmake_minimum_required(VERSION 3.24)
if(NOT DK_RT_DIR OR NOT DK_RT_TARGETS)
  message(FATAL_ERROR "usage: cmake -DDK_RT_DIR=<dir> -DDK_RT_TARGETS=a,b [-DDK_FLATC_DIR=<dir> "
                      "-DDK_FLATBUFFERS_SOURCE_DIR=<dir>] -P build.cmake")
endif()

if(DK_FLATC_DIR AND NOT EXISTS "${DK_FLATC_DIR}/bin/flatc")
  file(MAKE_DIRECTORY "${DK_FLATC_DIR}")
  file(LOCK "${DK_FLATC_DIR}/.dk-build.lock" GUARD PROCESS TIMEOUT 7200 RESULT_VARIABLE _lock)
  if(_lock)
    message(FATAL_ERROR "could not lock ${DK_FLATC_DIR}: ${_lock}")
  endif()
  if(NOT EXISTS "${DK_FLATC_DIR}/bin/flatc")
    message(STATUS "Building the host flatc in ${DK_FLATC_DIR}")
    # As ExecuTorch's third-party/CMakeLists.txt builds it, for the host (no toolchain file).
    set(_gen)
    if(DK_GENERATOR)
      set(_gen -G "${DK_GENERATOR}")
      if(DK_MAKE_PROGRAM)
        list(APPEND _gen "-DCMAKE_MAKE_PROGRAM=${DK_MAKE_PROGRAM}")
      endif()
    endif()
    execute_process(
      COMMAND ${CMAKE_COMMAND} -S "${DK_FLATBUFFERS_SOURCE_DIR}" -B "${DK_FLATC_DIR}/build" ${_gen}
              -DCMAKE_TOOLCHAIN_FILE= -DCMAKE_BUILD_TYPE=Release
              -DFLATBUFFERS_BUILD_FLATC=ON -DFLATBUFFERS_BUILD_FLATLIB=OFF
              -DFLATBUFFERS_BUILD_FLATHASH=OFF -DFLATBUFFERS_BUILD_TESTS=OFF
              -DFLATBUFFERS_INSTALL=OFF -DCMAKE_CXX_FLAGS=-DFLATBUFFERS_MAX_ALIGNMENT=1024
      OUTPUT_FILE "${DK_FLATC_DIR}/configure.log" ERROR_FILE "${DK_FLATC_DIR}/configure.log"
      RESULT_VARIABLE _rc)
    if(NOT _rc)
      execute_process(
        COMMAND ${CMAKE_COMMAND} --build "${DK_FLATC_DIR}/build" --target flatc --parallel
        OUTPUT_FILE "${DK_FLATC_DIR}/build.log" ERROR_FILE "${DK_FLATC_DIR}/build.log"
        RESULT_VARIABLE _rc)
    endif()
    if(_rc)
      message(FATAL_ERROR "building the host flatc failed; see ${DK_FLATC_DIR}/*.log")
    endif()
    file(MAKE_DIRECTORY "${DK_FLATC_DIR}/bin")
    file(COPY_FILE "${DK_FLATC_DIR}/build/flatc" "${DK_FLATC_DIR}/bin/flatc.tmp")
    file(RENAME "${DK_FLATC_DIR}/bin/flatc.tmp" "${DK_FLATC_DIR}/bin/flatc")
  endif()
  file(LOCK "${DK_FLATC_DIR}/.dk-build.lock" RELEASE)
endif()

string(REPLACE "," ";" _targets "${DK_RT_TARGETS}")
file(LOCK "${DK_RT_DIR}/.dk-build.lock" GUARD PROCESS TIMEOUT 7200 RESULT_VARIABLE _lock)
if(_lock)
  message(FATAL_ERROR "could not lock ${DK_RT_DIR}: ${_lock}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${DK_RT_DIR}" --target ${_targets}
                RESULT_VARIABLE _rc)
if(_rc)
  message(FATAL_ERROR "building the ExecuTorch runtime in ${DK_RT_DIR} failed (${_rc})")
endif()
