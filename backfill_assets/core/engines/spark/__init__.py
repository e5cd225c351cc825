"""The Spark build engine: both stages built by Apache Spark, for data past one machine."""
