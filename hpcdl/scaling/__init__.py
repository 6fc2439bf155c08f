"""Scaling: the speed-up and efficiency table, sweeps over rank counts, and the analytical
model that predicts scaling past the machines measured."""
