"""kvbench.dashboards"""
