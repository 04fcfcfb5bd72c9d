# Compiler settings shared by every meshtensor target, applied through one interface library.
# Installed as meshtensor::options: what consumers get is only -ffp-contract=off, which the inline
# numeric code of the headers needs as much as the libraries do.
add_library(meshtensor_options INTERFACE)
set_target_properties(meshtensor_options PROPERTIES EXPORT_NAME options)
target_compile_options(meshtensor_options INTERFACE
  $<BUILD_INTERFACE:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  # Results must not depend on whether the compiler fuses a*b+c: reductions promise fixed bits.
  -ffp-contract=off)
if(MESHTENSOR_WERROR)
  target_compile_options(meshtensor_options INTERFACE $<BUILD_INTERFACE:-Werror>)
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
  target_compile_options(meshtensor_options INTERFACE $<BUILD_INTERFACE:${_san_flags}>)
  target_link_options(meshtensor_options INTERFACE $<BUILD_INTERFACE:${_san_flags}>)
endif()

# One static library per layer of DESIGN.md; `deps` are the layers below it. Each is installed
# and exported as meshtensor::<layer> (see cmake/MeshtensorInstall.cmake).
set_property(GLOBAL PROPERTY MESHTENSOR_LAYERS "")
function(meshtensor_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(meshtensor_${name} STATIC ${ARG_SOURCES})
  add_library(meshtensor::${name} ALIAS meshtensor_${name})
  set_target_properties(meshtensor_${name} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(meshtensor_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                       $<INSTALL_INTERFACE:include>)
  target_link_libraries(meshtensor_${name} PUBLIC meshtensor_options ${ARG_DEPS})
  set_property(GLOBAL APPEND PROPERTY MESHTENSOR_LAYERS meshtensor_${name})
endfunction()
