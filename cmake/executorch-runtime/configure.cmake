# configure.cmake: the cache key of the model-independent ExecuTorch runtime and its build
# directory, configured once per key (included by cmake/ExecuTorchRuntime.cmake, in its scope).
#
# It is in the runtime project's directory because everything that decides how a runtime
# directory is configured is hashed into the key from this directory's files (key.cmake,
# dk_et_runtime_project_files): the model-side rest of ExecuTorchRuntime.cmake (which kernels a
# model registers, how the firmware links, deploykit's own kernels) can change without making
# every cached runtime stale. Sets DK_ET_RUNTIME_KEY, DK_ET_RUNTIME_DIR and _dk_rt_state (new or
# cached).

include(${_DK_ET_CMAKE_DIR}/executorch-runtime/key.cmake)
# The host flatc depends only on the ExecuTorch tree: one per tree, shared by every key.
if(DK_FLATC)
  set(_dk_flatc ${DK_FLATC})
  set(_dk_flatc_dir "")
else()
  file(READ ${EXECUTORCH_SOURCE_DIR}/version.txt _dk_etv)
  string(SHA256 _dk_h "${EXECUTORCH_SOURCE_DIR} ${_dk_etv} ${CMAKE_HOST_SYSTEM}")
  string(SUBSTRING "${_dk_h}" 0 12 _dk_h)
  set(_dk_flatc_dir ${DK_ET_RUNTIME_CACHE_DIR}/host-flatc-${_dk_h})
  set(_dk_flatc ${_dk_flatc_dir}/bin/flatc)
endif()
dk_et_runtime_key(DK_ET_RUNTIME_KEY _dk_label _dk_key_text)
set(DK_ET_RUNTIME_DIR ${DK_ET_RUNTIME_CACHE_DIR}/${_dk_label}-${DK_ET_RUNTIME_KEY})

# ---- configure the runtime build directory (once per key) ----
# A runtime directory is configured when dk-runtime-configured exists: written last, after a
# configure that succeeded and left its build files (a configure killed, or cut short by a
# full disk, can leave dk-runtime-targets.cmake without build.ninja). Without the mark the
# directory is configured again.
set(_dk_rt_mark ${DK_ET_RUNTIME_DIR}/dk-runtime-configured)
function(_dk_et_configure_runtime)
  set(_rt ${DK_ET_RUNTIME_DIR})
  file(MAKE_DIRECTORY ${_rt}/board)
  file(LOCK ${_rt}/.dk-build.lock GUARD FUNCTION TIMEOUT 7200)
  if(EXISTS ${_dk_rt_mark})
    return()  # configured by someone else while we waited
  endif()
  # The toolchain file reads board.cmake from DK_GENERATED_DIR: keep a copy with the runtime, so
  # it does not depend on this firmware build's directory.
  file(COPY_FILE ${DK_GENERATED_DIR}/board.cmake ${_rt}/board/board.cmake)
  # Likewise the runtime project and the toolchain file (key.cmake keys both by content): the
  # directory is configured from copies of its own, so its build files (the CMake re-run rule,
  # the cortex_m kernels' -include) name no checkout, and any deploykit whose files are the same
  # can build in it, whichever checkout configured it first.
  dk_et_runtime_project_files(_project_files)
  file(REMOVE_RECURSE ${_rt}/project)
  file(MAKE_DIRECTORY ${_rt}/project/toolchain)
  foreach(_f IN LISTS _project_files)
    get_filename_component(_fn ${_f} NAME)
    file(COPY_FILE ${_f} ${_rt}/project/${_fn})
  endforeach()
  get_filename_component(_tc_name ${CMAKE_TOOLCHAIN_FILE} NAME)
  file(COPY_FILE ${CMAKE_TOOLCHAIN_FILE} ${_rt}/project/toolchain/${_tc_name})
  file(WRITE ${_rt}/dk-runtime-key.txt "${_dk_key_text}")
  set(_args
      -S ${_rt}/project -B ${_rt} -G ${CMAKE_GENERATOR}
      -DCMAKE_TOOLCHAIN_FILE=${_rt}/project/toolchain/${_tc_name}
      -DDK_GENERATED_DIR=${_rt}/board
      -DCMAKE_BUILD_TYPE=${DK_ET_BUILD_TYPE}
      # The firmware's own flags (the toolchain's, plus any given on its command line), so the
      # runtime is compiled for exactly the same ABI.
      "-DCMAKE_C_FLAGS=${CMAKE_C_FLAGS}"
      "-DCMAKE_CXX_FLAGS=${CMAKE_CXX_FLAGS}"
      -DEXECUTORCH_SOURCE_DIR=${EXECUTORCH_SOURCE_DIR}
      -DDK_CMSIS_NN_DIR=${DK_CMSIS_NN_DIR}
      -DDK_ET_LOGGING=${DK_ET_LOGGING}
      -DDK_ET_PIC=${DK_ET_PIC}
      -DDK_LTO=${DK_LTO}
      "-DDK_ET_KERNEL_OPT=${DK_ET_KERNEL_OPT}"
      "-DDK_ET_CMSIS_NN_OPT=${DK_ET_CMSIS_NN_OPT}"
      -DDK_ET_FP_CONTRACT=${DK_ET_FP_CONTRACT}
      -DDK_FLATC=${_dk_flatc}
      -DDK_ETHOS_U=${DK_ETHOS_U}
      -DDK_ET_EVENT_TRACER=${DK_PROFILE_EVENTS}
      -DDK_ETHOS_U_DRIVER_DIR=${DK_ETHOS_U_DRIVER_DIR}
      -DDK_CMSIS_DIR=${DK_CMSIS_DIR}
      -DDK_ETHOS_U_NPU_CONFIG=${DK_ETHOS_U_NPU_CONFIG}
      -DPYTHON_EXECUTABLE=${PYTHON_EXECUTABLE})
  if(CMAKE_MAKE_PROGRAM)
    list(APPEND _args -DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM})
  endif()
  if(DK_TOOLCHAIN_PREFIX)
    list(APPEND _args -DDK_TOOLCHAIN_PREFIX=${DK_TOOLCHAIN_PREFIX})
  endif()
  if(DK_LTO)
    # Archives of LTO objects get their symbol index from the LTO plugin: plain ar/ranlib
    # leave an index without the LTO symbols, and the link then misses them.
    list(APPEND _args -DCMAKE_AR=${_dk_gcc_ar} -DCMAKE_RANLIB=${_dk_gcc_ranlib})
  endif()
  message(STATUS "ExecuTorch runtime: configuring ${_rt}")
  execute_process(COMMAND ${CMAKE_COMMAND} ${_args}
                  OUTPUT_FILE ${_rt}/configure.log ERROR_FILE ${_rt}/configure.log
                  RESULT_VARIABLE _rc)
  if(CMAKE_GENERATOR MATCHES "Ninja")
    set(_build_file ${_rt}/build.ninja)
  else()
    set(_build_file ${_rt}/Makefile)
  endif()
  if(_rc OR NOT EXISTS ${_rt}/dk-runtime-targets.cmake OR NOT EXISTS ${_build_file})
    # The log's end in the message: its cause (a full disk says "No space left on device")
    # reaches the firmware build's log and the host.
    set(_tail "")
    if(EXISTS ${_rt}/configure.log)
      file(SIZE ${_rt}/configure.log _size)
      math(EXPR _from "${_size} - 1500")
      if(_from LESS 0)
        set(_from 0)
      endif()
      file(READ ${_rt}/configure.log _tail OFFSET ${_from})
    endif()
    message(FATAL_ERROR "ExecuTorch runtime: configuring ${_rt} failed; see "
                        "${_rt}/configure.log, which ends:\n${_tail}")
  endif()
  file(WRITE ${_dk_rt_mark} "${_dk_key_text}")
endfunction()
# gcc-ar / gcc-ranlib beside the compiler (same prefix), for LTO archives.
string(REGEX REPLACE "(g\\+\\+|c\\+\\+)$" "gcc-ar" _dk_gcc_ar "${CMAKE_CXX_COMPILER}")
string(REGEX REPLACE "(g\\+\\+|c\\+\\+)$" "gcc-ranlib" _dk_gcc_ranlib "${CMAKE_CXX_COMPILER}")
if(NOT EXISTS ${_dk_rt_mark})
  _dk_et_configure_runtime()
  set(_dk_rt_state "new")
else()
  set(_dk_rt_state "cached")
endif()
