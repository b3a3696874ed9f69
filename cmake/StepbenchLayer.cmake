# One CMake target per layer of the code, linked only downward, and an include root per target that
# holds exactly that target's headers: a file sees the headers of its own layer and of the layers
# it links, so an include that runs up a layer fails to build ("No such file or directory").
#
#   stepbench_layer(<target> HEADERS <h>... SOURCES <s>... [DEPS <t>...] [PRIVATE_DEPS <t>...])
#
# HEADERS and SOURCES are relative to the calling folder; headers are included by their path below
# src/ ("graph/graph.hpp"), through links in <build>/layers/<target>/. Includes with ".." are refused
# by scripts/lint.sh, which would get around this.
function(stepbench_layer target)
  cmake_parse_arguments(PARSE_ARGV 1 L "" "" "HEADERS;SOURCES;DEPS;PRIVATE_DEPS")
  set(root ${PROJECT_BINARY_DIR}/layers/${target})
  file(REMOVE_RECURSE ${root})
  foreach(h IN LISTS L_HEADERS)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR}/${h})
    get_filename_component(dir ${root}/${rel} DIRECTORY)
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR}/${h} ${root}/${rel} SYMBOLIC)
  endforeach()
  if(L_SOURCES)
    add_library(${target} STATIC ${L_SOURCES} ${L_HEADERS})
    target_link_libraries(${target} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)  # never installed
    target_compile_options(${target} PRIVATE ${STEPBENCH_WARNINGS})
  else()
    add_library(${target} INTERFACE ${L_HEADERS})
    target_link_libraries(${target} INTERFACE ${L_DEPS})
    target_include_directories(${target} INTERFACE $<BUILD_INTERFACE:${root}>)
  endif()
  set_property(GLOBAL APPEND PROPERTY STEPBENCH_LAYERS ${target})
endfunction()
