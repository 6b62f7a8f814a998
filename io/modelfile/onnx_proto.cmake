# The ONNX schema as C: io/modelfile/onnx.c reads ONNX model files with the code protoc-c
# generates at build time from Debian's onnx.proto (libonnx-dev), into
# <build>/gen/onnx/onnx.pb-c.[ch] (included as <onnx/onnx.pb-c.h>). Used by the
# top-level CMakeLists.txt and by fuzz/CMakeLists.txt. Sets TW_ONNX_PB_C (the
# generated source to compile), TW_ONNX_GEN_DIR (its include directory) and
# the imported target PkgConfig::PROTOBUF_C.
pkg_check_modules(PROTOBUF_C REQUIRED IMPORTED_TARGET libprotobuf-c)
find_program(TW_PROTOC_C NAMES protoc-c REQUIRED)
find_file(TW_ONNX_PROTO onnx.proto PATHS /usr/include/onnx NO_DEFAULT_PATH REQUIRED)
get_filename_component(_tw_onnx_dir ${TW_ONNX_PROTO} DIRECTORY)
get_filename_component(_tw_onnx_root ${_tw_onnx_dir} DIRECTORY)
set(TW_ONNX_GEN_DIR ${CMAKE_BINARY_DIR}/gen)
set(TW_ONNX_PB_C ${TW_ONNX_GEN_DIR}/onnx/onnx.pb-c.c)
add_custom_command(OUTPUT ${TW_ONNX_PB_C} ${TW_ONNX_GEN_DIR}/onnx/onnx.pb-c.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${TW_ONNX_GEN_DIR}
  COMMAND ${TW_PROTOC_C} --c_out=${TW_ONNX_GEN_DIR} -I${_tw_onnx_root} ${TW_ONNX_PROTO}
  DEPENDS ${TW_ONNX_PROTO}
  COMMENT "protoc-c: ${TW_ONNX_PROTO} to C")
