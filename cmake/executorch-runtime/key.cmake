# key.cmake: the cache key of a cached ExecuTorch runtime build directory (included by
# configure.cmake; tests/unit/test_profiles.py runs it in script mode).
#
# dk_et_runtime_key(<key> <label> <text>): <text> lists every input the runtime's objects
# depend on, one `name=value` line each; <key> is the first 16 hex digits of its SHA-256 and
# <label> `et<version>-<core>` (the directory is <cache>/<label>-<key>). Inputs, from the
# caller's scope: EXECUTORCH_SOURCE_DIR (version.txt is read), DK_ET_COMMIT, DK_CMSIS_NN_DIR,
# _dk_flatc, the compilers and their versions, CMAKE_GENERATOR, CMAKE_TOOLCHAIN_FILE (its file
# name and content hash) and DK_TOOLCHAIN_PREFIX, DK_GENERATED_DIR/board.cmake (DK_CPU_FLAGS,
# DK_CPU_CORE), the firmware's C/C++ flags and those of the runtime's build type, and the build
# profile's runtime options (docs/profiles.md): DK_ET_BUILD_TYPE, DK_ET_KERNEL_OPT,
# DK_ET_CMSIS_NN_OPT, DK_ET_LOGGING, DK_ET_PIC, DK_LTO, plus DK_ET_FP_CONTRACT; with DK_ETHOS_U=ON
# also the NPU half (ethos_u.cmake): the driver and CMSIS paths, the driver's commit
# (DK_ETHOS_U_DRIVER_COMMIT, from the workspace) and the NPU configuration; and the deploykit
# that builds: its version (DK_DEPLOYKIT_VERSION) and a hash of the runtime project's own files
# (this directory: the project, configure.cmake that configures it, this file), so that a
# deploykit whose runtime project differs makes its own runtime instead of reusing objects it did
# not build. The model-side rest of ExecuTorchRuntime.cmake is not hashed: it decides how a
# firmware links a runtime, not how the runtime is built.
#
# The key is by content, never by where deploykit is: no line names the checkout (the toolchain
# file is keyed by its name and content, the project by its files' content), so checkouts with
# byte-identical files sharing one workspace (a second clone, a git worktree, another venv's
# install) share its runtimes. configure.cmake copies the runtime project and the
# toolchain file into the runtime directory (<dir>/project/, dk_et_runtime_project_files() lists
# the files) and configures it from the copies, so the directory's build files name only itself
# and the workspace. The paths that stay in the key (ExecuTorch, CMSIS-NN, flatc, compilers,
# Ethos-U driver, CMSIS) are the workspace's and the machine's, the same for every checkout.
#
# Without DK_ETHOS_U the text has no Ethos-U line. With DK_PROFILE_EVENTS=ON (profiling
# firmware) the runtime is built with its EventTracer hooks and the text has an
# `event_tracer=ON` line. The profile's link-time options (kernel registry size, primitive
# operators, lean libc) are model-side: not in the key.

# The runtime project's files (this directory's): those the key hashes and those copied into a
# runtime directory, sorted.
function(dk_et_runtime_project_files out)
  file(GLOB _files ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/*.cmake
       ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/*.h
       ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/CMakeLists.txt)
  list(SORT _files)
  set(${out} ${_files} PARENT_SCOPE)
endfunction()

function(dk_et_runtime_key out_key out_label out_text)
  include(${DK_GENERATED_DIR}/board.cmake)  # DK_CPU_FLAGS, DK_CPU_CORE (function scope)
  file(SHA256 ${CMAKE_TOOLCHAIN_FILE} _tc)
  file(READ ${EXECUTORCH_SOURCE_DIR}/version.txt _etv)
  string(STRIP "${_etv}" _etv)
  string(TOUPPER "${DK_ET_BUILD_TYPE}" _bt)
  get_filename_component(_tc_name ${CMAKE_TOOLCHAIN_FILE} NAME)
  dk_et_runtime_project_files(_project_files)
  list(SORT _project_files)
  set(_project "")
  foreach(_f IN LISTS _project_files)
    file(SHA256 ${_f} _fh)
    get_filename_component(_fn ${_f} NAME)
    string(APPEND _project "${_fn}=${_fh}\n")
  endforeach()
  string(SHA256 _project "${_project}")
  string(SUBSTRING "${_project}" 0 16 _project)
  set(_text "")
  foreach(_item
      "executorch=${_etv} ${EXECUTORCH_SOURCE_DIR}"
      "cmsis_nn=${DK_CMSIS_NN_DIR}"
      "flatc=${_dk_flatc}"
      "cxx=${CMAKE_CXX_COMPILER} ${CMAKE_CXX_COMPILER_VERSION}"
      "c=${CMAKE_C_COMPILER} ${CMAKE_C_COMPILER_VERSION}"
      "generator=${CMAKE_GENERATOR}"
      "toolchain=${_tc_name} ${_tc} ${DK_TOOLCHAIN_PREFIX}"
      "cpu_flags=${DK_CPU_FLAGS}"
      "c_flags=${CMAKE_C_FLAGS} | ${CMAKE_C_FLAGS_${_bt}}"
      "cxx_flags=${CMAKE_CXX_FLAGS} | ${CMAKE_CXX_FLAGS_${_bt}}"
      "build_type=${DK_ET_BUILD_TYPE}"
      "kernel_opt=${DK_ET_KERNEL_OPT}"
      "cmsis_nn_opt=${DK_ET_CMSIS_NN_OPT}"
      "logging=${DK_ET_LOGGING}"
      "pic=${DK_ET_PIC}"
      "lto=${DK_LTO}"
      "fp_contract=${DK_ET_FP_CONTRACT}"
      "executorch_commit=${DK_ET_COMMIT}"
      "deploykit=${DK_DEPLOYKIT_VERSION} ${_project}")
    string(APPEND _text "${_item}\n")
  endforeach()
  # Only profiling runtimes carry this line, so the keys of all others are unchanged.
  if(DK_PROFILE_EVENTS)
    string(APPEND _text "event_tracer=ON\n")
  endif()
  if(DK_ETHOS_U)
    string(APPEND _text "ethos_u=${DK_ETHOS_U_NPU_CONFIG} driver=${DK_ETHOS_U_DRIVER_DIR} "
                        "${DK_ETHOS_U_DRIVER_COMMIT} cmsis=${DK_CMSIS_DIR}\n")
  endif()
  string(SHA256 _h "${_text}")
  string(SUBSTRING "${_h}" 0 16 _h)
  set(_label "et${_etv}-${DK_CPU_CORE}")
  if(DK_ETHOS_U)
    string(APPEND _label "-${DK_ETHOS_U_NPU_CONFIG}")
  endif()
  string(REGEX REPLACE "[^A-Za-z0-9_.+-]" "_" _label "${_label}")
  set(${out_key} ${_h} PARENT_SCOPE)
  set(${out_label} ${_label} PARENT_SCOPE)
  set(${out_text} "${_text}" PARENT_SCOPE)
endfunction()
