# Tests of the public API, the Python package and the QGIS provider that need
# more than the e2e_* glob gives them: pytest over tests/python (Debian's
# python3-pytest) with the build's library. (tests/e2e_capi.py and
# tests/e2e_qgis.py are registered by the glob in CMakeLists.txt.)
add_test(NAME py_tilewise COMMAND ${TW_PYTHON} -m pytest -q -p no:cacheprovider
  ${PROJECT_SOURCE_DIR}/tests/python)
set_tests_properties(py_tilewise PROPERTIES FIXTURES_REQUIRED fx TIMEOUT 900
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR} SKIP_RETURN_CODE 5
  ENVIRONMENT "${TW_TEST_ENV};TILEWISE_LIBRARY=$<TARGET_FILE:tilewise_shared>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
