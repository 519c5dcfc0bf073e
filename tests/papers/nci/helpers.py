"""Constants shared by the NCI test modules: K source domains, batch B, image side S."""


K, B, S = 2, 4, 8
