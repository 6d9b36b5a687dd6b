"""Proto-RL: the agent (`agent`) and its math (`math`: Sinkhorn, the cluster-assignment loss, the candidates and
the k-NN reward)."""
