"""Operations tooling: checks that a machine runs the project as claimed (the GPU check, ``make
gpu-check``). Belongs here: a tool that validates an environment rather than measuring a method."""
