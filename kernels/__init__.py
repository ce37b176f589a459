"""kvbench.kernels"""
