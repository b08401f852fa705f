# FLEXH2O_MPI=AUTO builds `flexh2o run` over several ranks (mpirun, srun) when an MPI C library
# is found (Debian: libopenmpi-dev + openmpi-bin); ON requires it; OFF leaves it out. Only the
# flexh2o binary and the Python module link MPI (engine/distributed's MPI part, engine/job/run_ranks.cc).
set(FLEXH2O_MPI AUTO CACHE STRING "Runs over several ranks with MPI: AUTO (when MPI is found), ON or OFF")
set_property(CACHE FLEXH2O_MPI PROPERTY STRINGS AUTO ON OFF)
set(FLEXH2O_HAVE_MPI OFF)
if(NOT FLEXH2O_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(FLEXH2O_HAVE_MPI ON)
  elseif(FLEXH2O_MPI STREQUAL "ON")
    message(FATAL_ERROR "FLEXH2O_MPI=ON but no MPI was found; install libopenmpi-dev and openmpi-bin, or use -DFLEXH2O_MPI=OFF")
  endif()
endif()
message(STATUS "flexh2o: MPI ${FLEXH2O_HAVE_MPI}")
