"""Running a program in this process: the reference executor (`run_local`), the driver's cost sample, a processing element's calibration."""
