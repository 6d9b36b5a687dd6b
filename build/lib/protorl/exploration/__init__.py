"""Measures of exploration (section 5.6, figures 1 and 10): state coverage, the maps, the variance of the k-NN
reward and the uniform-random reference every run is compared with."""
