"""Reading records and judging them: the verdict, comparisons, claims, history and regressions."""
