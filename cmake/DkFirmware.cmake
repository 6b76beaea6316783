# dk_firmware_outputs(<target>): what every deploykit firmware image gets, whichever CMake
# project builds it (firmware/ or firmware/pico/): <target>.elf in the build directory, a map
# file beside it (read by deploykit's size report), the per-region memory usage printed at
# link time, and the section sizes after the build.
function(dk_firmware_outputs target)
  set_target_properties(${target} PROPERTIES
    SUFFIX .elf
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
  )
  target_link_options(${target} PRIVATE
    "LINKER:-Map=$<TARGET_FILE_DIR:${target}>/${target}.map"
    "LINKER:--print-memory-usage"
  )
  if(CMAKE_SIZE)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_SIZE} $<TARGET_FILE:${target}>
      VERBATIM)
  endif()
endfunction()
