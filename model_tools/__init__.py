"""`fraud-model`, the offline model tools: import a trained model as a package, inspect one,
publish it to MLflow, promote it. Above the service: nothing on the scoring path imports it."""
