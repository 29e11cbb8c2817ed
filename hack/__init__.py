"""Development tooling: not part of the tritonscale package, its wheel or its images."""
