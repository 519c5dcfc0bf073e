"""Small embedded texts (written for this project) for sanity checks and tiny finetuning runs."""

NATURAL_SENTENCE = "The cat sat on the mat and looked out of the window."
# The same twelve words, lower-cased and shuffled with random.Random(0).shuffle, first letter capitalised.
SHUFFLED_SENTENCE = "Cat of out mat the sat on looked the the window and."

LONG_PARAGRAPH = (
    "The history of the printing press begins in the middle of the fifteenth century, when Johannes Gutenberg, "
    "a goldsmith from Mainz, combined several existing technologies into a practical system for producing books. "
    "Movable metal type, oil-based ink and a wooden screw press allowed printers to make hundreds of identical "
    "copies far more quickly than scribes could copy a single manuscript by hand. Within a few decades, printing "
    "shops had spread to more than two hundred cities across Europe, and the price of books fell sharply. "
    "Scholars could compare the same text in different places, errors were corrected more easily, and new ideas "
    "travelled faster than ever before.")

PARAPHRASES = (
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The weather is cold and rainy today.", "Today it is chilly and wet outside."),
    ("She bought a new car last week.", "Last week she purchased a new automobile."),
    ("The children are reading books in the library.", "Kids are reading in the library."),
)
UNRELATED = (
    "The stock market fell sharply this morning.",
    "Photosynthesis converts light into chemical energy.",
    "The recipe needs two cups of flour.",
    "The train to Berlin leaves at noon.",
)

# A few paragraphs for tiny finetuning runs (tokenizer training and causal-LM steps).
TRAIN_TEXTS = (
    "Bees visit flowers to collect nectar and pollen. As they move from one blossom to the next, they carry "
    "pollen on their bodies, which helps plants produce seeds and fruit.",
    "A river begins as a small stream in the hills. It gathers water from rain and melting snow, grows wider as "
    "other streams join it, and finally reaches the sea.",
    "The library opens at nine in the morning. Students come to read, to study for exams, and to borrow books "
    "that they take home for two weeks.",
    "Bread is made from flour, water, salt and yeast. The yeast feeds on sugars in the dough and releases gas, "
    "which makes the bread rise before it is baked.",
    "The moon orbits the earth about once a month. Its shape seems to change because we see different parts of "
    "it lit by the sun as it moves around us.",
    "A good map shows roads, rivers and towns at a chosen scale. Travellers use it to plan a route and to "
    "estimate how long a journey will take.",
    "Trees lose their leaves in autumn to save water during the cold months. In spring new leaves grow, and the "
    "forest turns green again.",
    "The baker opens the shop early, before the sun rises. By seven the shelves are full of warm loaves, rolls "
    "and small cakes.",
)
HELD_OUT_TEXT = ("Birds build nests in spring to protect their eggs. Both parents often bring food to the young "
                 "until they are strong enough to fly.")

# Question/answer pairs in a fixed format for a LoRA finetuning check (the model learns the answer style).
QA_PAIRS = (
    ("What colour is the sky on a clear day?", "Answer: blue."),
    ("How many legs does a spider have?", "Answer: eight."),
    ("What do bees make?", "Answer: honey."),
    ("What is frozen water called?", "Answer: ice."),
    ("Which planet do we live on?", "Answer: Earth."),
    ("What animal says moo?", "Answer: a cow."),
    ("How many days are in a week?", "Answer: seven."),
    ("What do you use to write on paper?", "Answer: a pen."),
)
HELD_OUT_QA = (
    ("What is the opposite of hot?", "Answer: cold."),
    ("How many wheels does a bicycle have?", "Answer: two."),
)
