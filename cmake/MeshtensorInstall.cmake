# `cmake --install`: headers, the layer libraries, the command-line tool, a CMake package
# (find_package(meshtensor): meshtensor::meshtensor and meshtensor::<layer>) and a pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(_layers GLOBAL PROPERTY MESHTENSOR_LAYERS)
# Everything in one target, for consumers that do not pick layers.
add_library(meshtensor_all INTERFACE)
add_library(meshtensor::meshtensor ALIAS meshtensor_all)
set_target_properties(meshtensor_all PROPERTIES EXPORT_NAME meshtensor)
target_link_libraries(meshtensor_all INTERFACE ${_layers})

install(TARGETS meshtensor_options meshtensor_all ${_layers} EXPORT meshtensorTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS meshtensor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/meshtensor DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(_package_dir ${CMAKE_INSTALL_LIBDIR}/cmake/meshtensor)
install(EXPORT meshtensorTargets NAMESPACE meshtensor:: DESTINATION ${_package_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/meshtensorConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/meshtensorConfig.cmake
                              INSTALL_DESTINATION ${_package_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/meshtensorConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/meshtensorConfig.cmake
              ${PROJECT_BINARY_DIR}/meshtensorConfigVersion.cmake
        DESTINATION ${_package_dir})

# pkg-config: the layers in link order (a layer before the ones it uses).
set(_pc_libs "")
foreach(layer comm_mpi train checkpoint fsdp dtensor nn comm plan kernels mesh core)
  string(APPEND _pc_libs " -lmeshtensor_${layer}")
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/meshtensor.pc.in ${PROJECT_BINARY_DIR}/meshtensor.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/meshtensor.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
