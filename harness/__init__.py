"""kvbench.harness"""
