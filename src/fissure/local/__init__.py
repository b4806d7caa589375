"""Running a program in this process: `run_local`, the driver's cost sample, the PE's calibration."""
