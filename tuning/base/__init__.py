"""The floor every room stands on: one clock, statistics, thread names, progress, the shipped files' locations,
and one set of number formatters. Imports nothing else of the package."""
