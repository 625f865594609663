"""Test programs kept as files: each runs in its own interpreter, started by a test by path
(`tests.support.helpers.job_command`) or as a module by `zerodoc.demo.launch.Job`.
Parameters come by argv (or a JSON spec); each module docstring says which."""
