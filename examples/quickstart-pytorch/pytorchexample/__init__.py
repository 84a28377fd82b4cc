"""pytorchexample: Flower's quickstart-pytorch with flwr-fedeval's secure aggregation and private AUC."""
