# Builds named targets of a cached ExecuTorch runtime build directory, holding a lock so that
# two firmware builds sharing the directory never run ninja in it at the same time.
#
#   cmake -DDK_RT_DIR=<runtime build dir> -DDK_RT_TARGETS=a,b,c -P build.cmake
cmake_minimum_required(VERSION 3.24)
if(NOT DK_RT_DIR OR NOT DK_RT_TARGETS)
  message(FATAL_ERROR "usage: cmake -DDK_RT_DIR=<dir> -DDK_RT_TARGETS=a,b -P build.cmake")
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
