"""pytorch_example: Flower's advanced-pytorch with flwr-fedeval's secure aggregation and FHE AUC."""
