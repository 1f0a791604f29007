"""Runnable examples; a package so ``python -m examples.spark_pipeline.demo`` works."""
