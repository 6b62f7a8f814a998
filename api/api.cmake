# The public C API: libtilewise.so (soname libtilewise.so.0) from the same
# objects as the static library, exporting only tilewise_* (api/tilewise.map);
# tilewise.pc; what `cmake --install` installs; the API's tests.
include(GNUInstallDirs)

add_library(tilewise_shared SHARED $<TARGET_OBJECTS:tilewise_obj>)
set_target_properties(tilewise_shared PROPERTIES OUTPUT_NAME tilewise VERSION ${PROJECT_VERSION}
  SOVERSION 0 LINK_DEPENDS ${PROJECT_SOURCE_DIR}/api/tilewise.map
  PUBLIC_HEADER ${PROJECT_SOURCE_DIR}/include/tilewise.h)
target_link_libraries(tilewise_shared PRIVATE tilewise_obj)
target_link_options(tilewise_shared PRIVATE
  -Wl,--version-script=${PROJECT_SOURCE_DIR}/api/tilewise.map)
if(NOT TILEWISE_SANITIZE)
  target_link_options(tilewise_shared PRIVATE -Wl,--no-undefined)
endif()
target_include_directories(tilewise_shared INTERFACE ${PROJECT_SOURCE_DIR}/include)

file(RELATIVE_PATH TW_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" TW_PC_TO_PREFIX "${TW_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/api/tilewise.pc.in ${CMAKE_BINARY_DIR}/tilewise.pc @ONLY)

# Where things land (README "Installing"): PREFIX/bin/tilewise,
# PREFIX/lib/<multiarch>/libtilewise.so*, PREFIX/include/tilewise.h,
# PREFIX/lib/<multiarch>/pkgconfig/tilewise.pc, PREFIX/share/man/man1/tilewise.1,
# PREFIX/lib/python3/dist-packages/tilewise/ (the Python package),
# PREFIX/share/tilewise/qgis/tilewise_provider/ (the QGIS plugin).
set(TILEWISE_PYTHON_DIR "lib/python3/dist-packages" CACHE STRING
  "where the Python package goes, relative to the prefix")
set(TILEWISE_QGIS_DIR "${CMAKE_INSTALL_DATADIR}/tilewise/qgis" CACHE STRING
  "where the QGIS plugin folder goes, relative to the prefix (QGIS_PLUGINPATH)")
install(TARGETS tilewise RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS tilewise_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_BINARY_DIR}/tilewise.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES ${PROJECT_SOURCE_DIR}/tilewise.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/tilewise DESTINATION ${TILEWISE_PYTHON_DIR}
  PATTERN __pycache__ EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/qgis/tilewise_provider DESTINATION ${TILEWISE_QGIS_DIR}
  PATTERN __pycache__ EXCLUDE)
# The Python package finds the library of its own prefix first.
install(CODE "file(WRITE \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${TILEWISE_PYTHON_DIR}/tilewise/_libpath.py\"
  \"LIBRARY = '\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/libtilewise.so.0'\\n\")")
