"""What a run writes as it goes: CSV and TensorBoard logs (`logger`) and optional Weights & Biases (`tracking`)."""
