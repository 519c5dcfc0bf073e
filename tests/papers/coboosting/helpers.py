"""Constants shared by the Co-Boosting test modules: K classes, S image side."""


K = 4
S = 8
