"""tfexample: Flower's quickstart-tensorflow with flwr-fedeval's secure aggregation and private AUC."""
