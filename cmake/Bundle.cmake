# `cmake --build build --target bundle`: a self-contained directory for running flexh2o and
# its device tests on another Linux machine (a rented GPU server) without building there:
#   build/bundle/bin/  flexh2o, test_backend_ops (label gpu), test_kernels
#   build/bundle/lib/  the shared libraries they load that a bare server may lack (oneTBB,
#                      OpenBLAS + gfortran/quadmath, liburing, fmt, yaml-cpp, GLPK + its
#                      SuiteSparse/gmp/ltdl/zlib, PCRE2)
#   build/flexh2o-bundle.tar.gz
# The binaries carry DT_RPATH $ORIGIN/../lib (linked with --disable-new-dtags: unlike
# DT_RUNPATH, it also applies to the libraries' own dependencies, e.g. OpenBLAS's gfortran),
# so no LD_LIBRARY_PATH is needed. Left out: glibc's libraries (the loader must match them)
# and the NVIDIA driver and CUDA toolkit libraries (libcuda, libcublas*, libcudart: the
# server's own, matching its driver; cudart is linked statically anyway). libstdc++ and
# libgcc_s are left out too: Debian 12's libstdc++ needs glibc 2.36 (arc4random), while the
# binaries need only glibc 2.34 and GCC 12's libstdc++ (GLIBCXX_3.4.30), so without them the
# bundle also runs on Ubuntu 22.04 (glibc 2.35, libstdc++ 12), the usual GPU server image.
#
# Included at the end of the top-level CMakeLists.txt; this same file is also the script
# (cmake -P) that fills the directory.

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.21)
  string(REPLACE "|" ";" binaries "${BUNDLE_BINARIES}")
  file(REMOVE_RECURSE "${BUNDLE_DIR}")
  file(MAKE_DIRECTORY "${BUNDLE_DIR}/bin" "${BUNDLE_DIR}/lib")

  file(GET_RUNTIME_DEPENDENCIES
    EXECUTABLES ${binaries}
    RESOLVED_DEPENDENCIES_VAR deps
    UNRESOLVED_DEPENDENCIES_VAR missing
    PRE_EXCLUDE_REGEXES
      "^linux-vdso" "^ld-linux" "^libc\\.so" "^libm\\.so" "^libmvec\\.so" "^libpthread\\.so" "^libdl\\.so"
      "^librt\\.so" "^libresolv\\.so" "^libutil\\.so" "^libanl\\.so" "^libstdc\\+\\+\\.so" "^libgcc_s\\.so"
      "^libcuda\\.so" "^libcudart" "^libcublas" "^libnvidia" "^libnvrtc" "^libnvJitLink")
  if(missing)
    message(FATAL_ERROR "bundle: cannot find the shared libraries ${missing}")
  endif()
  foreach(dep IN LISTS deps)
    get_filename_component(name "${dep}" NAME)  # the name the binaries ask for (the soname)
    file(COPY_FILE "${dep}" "${BUNDLE_DIR}/lib/${name}")  # follows symlinks: the library itself
    message(STATUS "bundle: lib/${name} <- ${dep}")
  endforeach()

  foreach(bin IN LISTS binaries)
    get_filename_component(name "${bin}" NAME)
    file(COPY_FILE "${bin}" "${BUNDLE_DIR}/bin/${name}")
    # The build tree's RPATH names directories of this machine; keep only the bundle's lib/.
    file(RPATH_SET FILE "${BUNDLE_DIR}/bin/${name}" NEW_RPATH "$ORIGIN/../lib")
    message(STATUS "bundle: bin/${name}")
  endforeach()

  file(WRITE "${BUNDLE_DIR}/README.txt"
"flexh2o bundle (built with the CUDA backend: ${BUNDLE_CUDA})
  bin/flexh2o run ...                  the engine (see the project README)
  bin/test_backend_ops                 every op on the GPU against the CPU backend
  bin/test_kernels                     CPU op tests
  bin/bench_attention --backend cuda   decode attention's KV GB/s beside the device's copy bandwidth
  bin/bench_small_ops --backend cuda   the small ops between a layer's GEMMs, fused and unfused
lib/ holds the non-system libraries. The machine provides glibc >= 2.34, GCC 12's libstdc++
(Debian 12, Ubuntu 22.04 or newer), the NVIDIA driver and the CUDA ${BUNDLE_CUDA_VERSION} toolkit's
libcublas/libcublasLt (found through ldconfig or LD_LIBRARY_PATH).
")
  get_filename_component(parent "${BUNDLE_DIR}" DIRECTORY)
  get_filename_component(leaf "${BUNDLE_DIR}" NAME)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E tar czf "${BUNDLE_TARBALL}" "${leaf}"
                  WORKING_DIRECTORY "${parent}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "bundle: tar failed (${rc})")
  endif()
  message(STATUS "bundle: ${BUNDLE_DIR} and ${BUNDLE_TARBALL}")
  return()
endif()

# The GPU check (bench/gpu/check.sh) runs every one of these: a build without one (tests or
# benchmarks off) gets a bundle target that fails, naming what is missing.
set(_flexh2o_bundle_targets flexh2o test_backend_ops test_kernels bench_attention bench_small_ops)
set(_flexh2o_bundle_missing "")
foreach(_t IN LISTS _flexh2o_bundle_targets)
  if(NOT TARGET ${_t})
    list(APPEND _flexh2o_bundle_missing ${_t})
  endif()
endforeach()
if(_flexh2o_bundle_missing)
  string(REPLACE ";" ", " _flexh2o_bundle_missing "${_flexh2o_bundle_missing}")
  add_custom_target(bundle
    COMMAND "${CMAKE_COMMAND}" -E echo "bundle: this build has no ${_flexh2o_bundle_missing} (configure with FLEXH2O_BENCH=ON and the tests on)"
    COMMAND "${CMAKE_COMMAND}" -E false
    VERBATIM)
  return()
endif()
set(_flexh2o_bundle_files "")
foreach(_t IN LISTS _flexh2o_bundle_targets)
  set_property(TARGET ${_t} APPEND PROPERTY BUILD_RPATH "$ORIGIN/../lib")
  target_link_options(${_t} PRIVATE "LINKER:--disable-new-dtags")
  list(APPEND _flexh2o_bundle_files "$<TARGET_FILE:${_t}>")
endforeach()
string(REPLACE ";" "|" _flexh2o_bundle_files "${_flexh2o_bundle_files}")
set(_flexh2o_bundle_cuda_version "")
if(FLEXH2O_HAVE_CUDA)
  set(_flexh2o_bundle_cuda_version "${CUDAToolkit_VERSION}")
endif()
add_custom_target(bundle
  COMMAND "${CMAKE_COMMAND}"
    "-DBUNDLE_DIR=${CMAKE_BINARY_DIR}/bundle"
    "-DBUNDLE_TARBALL=${CMAKE_BINARY_DIR}/flexh2o-bundle.tar.gz"
    "-DBUNDLE_BINARIES=${_flexh2o_bundle_files}"
    "-DBUNDLE_CUDA=${FLEXH2O_HAVE_CUDA}"
    "-DBUNDLE_CUDA_VERSION=${_flexh2o_bundle_cuda_version}"
    -P "${CMAKE_CURRENT_LIST_FILE}"
  DEPENDS ${_flexh2o_bundle_targets}
  COMMENT "Bundling flexh2o and its device tests into ${CMAKE_BINARY_DIR}/bundle"
  VERBATIM)
