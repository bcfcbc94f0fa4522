"""Research drivers: multi-step studies over the library (a named experiment's sweep then its report,
head-training ablations, the draft vocabulary's coverage, the numeric tolerance of half precision).
Belongs here: a script that runs sweeps or trainings and tabulates what they found."""
