"""What the user describes: the box, the model, its weight formats, the parallel plan, the workload, GPU memory."""
