# Compiler settings shared by every meshtensor target, applied through one interface library.
add_library(meshtensor_options INTERFACE)
target_compile_options(meshtensor_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  # Results must not depend on whether the compiler fuses a*b+c: reductions promise fixed bits.
  -ffp-contract=off)
if(MESHTENSOR_WERROR)
  target_compile_options(meshtensor_options INTERFACE -Werror)
endif()

if(MESHTENSOR_SANITIZE STREQUAL "address")
  set(_san_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(MESHTENSOR_SANITIZE STREQUAL "thread")
  set(_san_flags -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT MESHTENSOR_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MESHTENSOR_SANITIZE must be '', 'address' or 'thread', not '${MESHTENSOR_SANITIZE}'")
endif()
if(MESHTENSOR_FUZZ)
  # Coverage instrumentation everywhere, so libFuzzer is guided through the library code too.
  list(APPEND _san_flags -fsanitize=fuzzer-no-link)
endif()
if(_san_flags)
  target_compile_options(meshtensor_options INTERFACE ${_san_flags})
  target_link_options(meshtensor_options INTERFACE ${_san_flags})
endif()

# One static library per layer of DESIGN.md; `deps` are the layers below it.
function(meshtensor_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(meshtensor_${name} STATIC ${ARG_SOURCES})
  add_library(meshtensor::${name} ALIAS meshtensor_${name})
  target_include_directories(meshtensor_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(meshtensor_${name} PUBLIC meshtensor_options ${ARG_DEPS})
endfunction()
