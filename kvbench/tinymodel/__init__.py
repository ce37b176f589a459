"""The locally built models kvbench serves on CPU: `build` makes the tiny Llama (and a GQA test model) and
checks the committed trained weights; `train` reruns the recipe that trained them. Nothing here is imported
by the harness at run time except to find the model's folder."""
