"""Prompt templates, topics and tool schemas written for this project (Apache-2.0, like the project).

Templated categories hold out whole templates (and topics) for the eval split, so that no eval prompt is a
train prompt with one word swapped.
"""

from __future__ import annotations

TRANSLATION_TEMPLATES = (
    "Translate the following {language} text into English:\n\n{text}",
    "Translate this into English.\n\n{language}: {text}\nEnglish:",
    "Please give an English translation of this {language} passage.\n\n\"{text}\"",
    "I found this {language} text and I don't speak {language}. What does it say in English?\n\n{text}",
    "{text}\n\nTranslate the {language} text above into natural, fluent English.",
    "Render the following {language} into English, keeping the meaning and tone:\n{text}",
)

SUMMARIZATION_TEMPLATES = (
    "Summarize the following text in two or three sentences.\n\n{text}",
    "Write a short summary of this text:\n\n{text}",
    "{text}\n\nTL;DR:",
    "Read the passage below and give its main points as a bulleted list.\n\n{text}",
    "Here is a description of a piece of software. Summarize what it is and who would use it, in one paragraph.\n\n{text}",
    "Condense the following into a single sentence that keeps the key information.\n\n{text}",
    "{text}\n\nExplain the text above in simple words for a beginner, in a few sentences.",
    "Give a one-paragraph abstract of the following documentation.\n\n{text}",
)

# QA: (template, kind); the eval split uses held-out phrasings.
QA_TEMPLATES = {
    "python": (
        "What does the Python function `{module}.{name}` do?",
        "In Python's standard library, what is `{module}.{name}` used for?",
        "Explain the purpose of `{name}` in the Python module `{module}`.",
        "I saw `{module}.{name}` in some Python code. What does it do, and when would I use it?",
        "Can you describe what `{module}.{name}()` returns in Python?",
    ),
    "command": (
        "What does the `{name}` command do on Linux?",
        "What is `{name}` used for?",
        "Explain the Unix command `{name}` and give an example of using it.",
        "How do I use `{name}` on a Debian system, and what is it for?",
        "I found a program called `{name}` on my computer. What is it?",
    ),
    "country": (
        "What currency is used in {country}?",
        "Tell me three facts about {country}.",
        "What is the capital city of {country}?",
        "Which languages are spoken in {country}?",
        "Where is {country} located, and which countries border it?",
    ),
    "language": (
        "Where is the {language} language spoken?",
        "Which language family does {language} belong to?",
        "How many people speak {language}, roughly?",
        "What writing system is used for {language}?",
        "Give me a short overview of the {language} language.",
    ),
    "package": (
        "What is the Debian package `{name}`?",
        "What would I install `{name}` for?",
        "Is `{name}` a library or a program, and what does it do?",
        "Describe the software package `{name}` in a few sentences.",
        "Why might a Linux user install `{name}`?",
    ),
}

CODE_TEMPLATES = (
    "Complete the following Python function:\n\n```python\n{source}```",
    "Implement this Python function. Return only the code.\n\n```python\n{source}```",
    "Write the body of the function below so that it does what its docstring says.\n\n```python\n{source}```",
    "Write a Python function `{name}` that does the following:\n\n{doc}",
)

RAG_TEMPLATES = (
    "Answer the question using only the context below.\n\nContext:\n{context}\n\nQuestion: {question}",
    (
        "You are given some documentation. Use it to answer the question, and say so if the answer is not in it."
        "\n\n{context}\n\nQuestion: {question}\nAnswer:"
    ),
    (
        "Context information is below.\n---------------------\n{context}\n---------------------\n"
        "Given the context information and not prior knowledge, answer the query.\nQuery: {question}"
    ),
    "Read these documents and then answer the question that follows.\n\n{context}\n\n{question}",
    "{context}\n\nBased on the documents above, {question_lower}",
)

RAG_QUESTIONS = {
    "option": (
        "What does the `{option}` option of `{command}` do?",
        "Which effect does passing `{option}` to `{command}` have?",
        "When would I use `{command} {option}`?",
        "What happens if I run `{command}` with `{option}`?",
    ),
    "package": (
        "What does the package `{package}` provide?",
        "Which of these packages is `{package}`, and what is it for?",
        "According to the documents, what is `{package}` used for?",
        "Describe `{package}` based on the documents.",
    ),
}

WRITING_TEMPLATES = (
    "Write a short poem about {topic}.",
    "Write a blog post of about 300 words about {topic}.",
    "Write a persuasive essay arguing for more public attention to {topic}.",
    "Write a short story in which {topic} plays an important role.",
    "Draft a friendly email to a colleague explaining {topic}.",
    "Write a product description for a new gadget related to {topic}.",
    "Write a speech for a school assembly about {topic}.",
    "Write a limerick about {topic}.",
    "Write a diary entry from someone who is fascinated by {topic}.",
    "Compose a haiku sequence (three haiku) about {topic}.",
    "Write the opening paragraph of a mystery novel involving {topic}.",
    "Write a letter to the editor of a local newspaper about {topic}.",
    "Write a motivational social media post about {topic}.",
    "Write a dialogue between two friends who disagree about {topic}.",
    "Write a short fairy tale for children about {topic}.",
    "Write an advertisement script of 30 seconds for a service related to {topic}.",
    "Write a review of an imaginary documentary about {topic}.",
    "Write a short biography of a fictional expert on {topic}.",
    "Write a cover letter for a job that involves {topic}.",
    "Write an encyclopedia-style introduction to {topic}.",
    "Write a travel guide entry for a festival celebrating {topic}.",
    "Write song lyrics (two verses and a chorus) about {topic}.",
    "Write a toast for a wedding whose couple met through {topic}.",
    "Write a humorous list of ten things nobody tells you about {topic}.",
)

TOPICS = (
    "the ocean", "autumn leaves", "a lighthouse keeper", "city traffic", "learning to cook", "the first day at a new job",
    "friendship", "climate change", "a rainy afternoon", "space exploration", "old libraries", "coffee", "mountain hiking",
    "a lost cat", "the history of bread", "public transport", "urban gardening", "an abandoned train station",
    "learning a new language", "the night sky", "honeybees", "volunteering", "a small bakery", "video games",
    "the invention of the printing press", "winter mornings", "a robot that wants to paint", "recycling", "chess",
    "a grandmother's recipe", "deserts", "online privacy", "marathon running", "street musicians", "the moon landing",
    "tea ceremonies", "a village festival", "bicycles", "sleep", "artificial intelligence", "the color blue",
    "a broken umbrella", "migrating birds", "remote work", "kindness", "a childhood treehouse", "thunderstorms",
    "electric cars", "museums", "a time traveler", "the smell of rain", "open-source software", "rivers", "photography",
    "the Olympic Games", "a bookshop at midnight", "pirates", "solar energy", "dinosaurs", "a family reunion",
    "jazz music", "the immune system", "penguins", "a first snowfall", "handwritten letters", "ancient Rome",
    "a busy airport", "board games", "forests", "the internet", "mathematics", "an unexpected inheritance",
    "a haunted house", "farmers' markets", "coral reefs", "moving to a new city", "a talking parrot", "sunflowers",
    "volcanoes", "the postal service", "mindfulness", "a power outage", "street food", "a secret garden",
    "the water cycle", "kites", "a retired astronaut", "origami", "wolves", "the last day of school", "glaciers",
    "an old photograph", "fireflies", "a chess tournament", "the Silk Road", "saving money", "a hot air balloon",
    "lost socks", "a mountain village", "bridges", "quantum computers", "a stray dog", "the Northern Lights",
    "public libraries", "a secret recipe", "the first telephone", "camping", "paper airplanes", "a clock tower",
    "vegetable soup", "whales", "a school science fair", "the desert at night", "wind turbines", "a music box",
    "typewriters", "fog", "a family pet", "the Renaissance", "sand castles", "an empty stadium", "bees and flowers",
    "a long train journey", "homemade pizza", "the stock market", "spiders", "a snow day", "lighthouses",
    "the Great Wall of China", "a tiny apartment", "rainforests", "a garage band", "the first computer", "owls",
    "a fishing trip", "candles", "a detective's notebook", "the harvest season", "a magic library", "skateboarding",
    "tides", "a marketplace in Morocco", "the speed of light", "a cactus", "violins", "a midnight train",
)  # fmt: skip

# Multi-turn chats (MT-Bench style): (category, first turn, second turn), both with a {topic} slot.
MT_TEMPLATES = (
    ("writing", "Write a short travel blog post about a trip that involved {topic}.", "Rewrite your post so that every sentence starts with the letter A."),
    ("writing", "Write a persuasive paragraph about why people should care about {topic}.", "Now write a counter-argument to your own paragraph."),
    ("writing", "Compose a short poem about {topic}.", "Turn the poem into a short prose story for children."),
    ("writing", "Write a formal email inviting experts to a conference on {topic}.", "Make the email more casual and half as long."),
    ("writing", "Write a tweet announcing a new podcast episode about {topic}.", "Write three alternative versions with different tones."),
    ("roleplay", "Pretend you are a tour guide. Introduce a museum exhibition about {topic}.", "A child in the group asks you why it matters. Answer them."),
    ("roleplay", "Act as a job interviewer for a position related to {topic}. Ask me your first question.", "I answer that I have five years of experience. Ask a follow-up question and explain why you ask it."),
    ("roleplay", "You are a famous chef. Describe a dish inspired by {topic}.", "Give the full recipe for the dish with quantities."),
    ("roleplay", "Play a detective who has just found a clue related to {topic}. Describe your thoughts.", "Now explain to your assistant what you will do next and why."),
    ("roleplay", "Imagine you are a teacher starting a lesson about {topic}. Write your opening.", "A student says the topic is boring. How do you respond?"),
    ("reasoning", "List three surprising ways {topic} could affect everyday life in the future.", "Which of the three is the most likely, and why?"),
    ("reasoning", "What are the pros and cons of spending public money on {topic}?", "Summarize your answer as a table with two columns."),
    ("reasoning", "Explain a common misconception about {topic}.", "How would you convince someone who still believes it?"),
    ("reasoning", "If you had to explain {topic} to someone from the year 1800, how would you do it?", "Now explain it to a five-year-old."),
    ("stem", "Explain the science behind {topic} in simple terms.", "Suggest a simple experiment a student could do at home to learn more."),
    ("stem", "What are the main technical challenges related to {topic}?", "Pick one challenge and propose a solution in detail."),
    ("stem", "How could data analysis help us understand {topic} better?", "Describe what data you would collect and how you would analyse it."),
    ("humanities", "How has {topic} been portrayed in art and literature?", "Name one modern example and discuss it briefly."),
    ("humanities", "Discuss the cultural significance of {topic} in different countries.", "Which aspect do you find most interesting? Explain in a few sentences."),
    ("humanities", "Write a short history of {topic}.", "What do you think its future will look like in fifty years?"),
    ("extraction", "Write a short paragraph about {topic} that mentions at least three people, two places and one date.", "Now extract the people, places and dates from your paragraph as a JSON object."),
    ("extraction", "Write five short customer reviews of a product related to {topic}, with mixed opinions.", "Rate each review as positive, negative or neutral, in a numbered list."),
    ("coding", "Write a Python class that could model {topic} in a simulation.", "Add a method that prints a summary of the object's state, and show example usage."),
    ("coding", "Design a small SQL database schema for an app about {topic}.", "Write an SQL query that returns the ten most recent entries."),
    ("coding", "Write a Python function that generates random trivia questions about {topic} from a list.", "Add unit tests for your function."),
    ("math", "Make up a word problem about {topic} that needs two steps of arithmetic, and solve it.", "Change the numbers so the answer doubles, and solve it again."),
    ("math", "Invent a probability puzzle involving {topic} and explain its solution.", "Now generalize the puzzle to n items and give the formula."),
    ("writing", "Write a limerick about {topic}.", "Explain the rhyme scheme you used."),
    ("roleplay", "You are a news anchor. Report breaking news about {topic}.", "Now interview an eyewitness; write both sides of the dialogue."),
    ("reasoning", "Give three arguments for and three against a ban related to {topic}.", "Which side do you find stronger? Give a balanced verdict."),
    ("stem", "What would happen to {topic} if the Earth's gravity were half as strong?", "Which of your predictions is least certain, and why?"),
    ("humanities", "Write an imaginary conversation between two historical figures about {topic}.", "What would a modern expert add to their conversation?"),
)  # fmt: skip

# Tool-calling: JSON-schema tools; user requests with {slot}s filled from the values given in `slots`.
TOOLS = (
    {"name": "get_weather", "description": "Get the current weather for a city.", "parameters": {"city": "string", "unit": "celsius|fahrenheit"},
     "requests": ("What's the weather like in {city} right now?", "Is it cold in {city} today? Give me the temperature in {unit}."), "slots": {"city": "city", "unit": "unit"}},
    {"name": "convert_currency", "description": "Convert an amount of money between two currencies.", "parameters": {"amount": "number", "from_currency": "ISO 4217 code", "to_currency": "ISO 4217 code"},
     "requests": ("How much is {amount} {from_currency} in {to_currency}?", "Convert {amount} {from_currency} to {to_currency}, please."), "slots": {"amount": "amount", "from_currency": "currency", "to_currency": "currency"}},
    {"name": "search_packages", "description": "Search the Debian archive for packages matching a query.", "parameters": {"query": "string", "max_results": "integer"},
     "requests": ("Find me up to {max_results} Debian packages for {query}.", "Which packages can I install for {query}? Show {max_results}."), "slots": {"query": "software_need", "max_results": "small_int"}},
    {"name": "set_timer", "description": "Start a countdown timer.", "parameters": {"minutes": "integer", "label": "string"},
     "requests": ("Set a timer for {minutes} minutes for the {label}.", "Remind me in {minutes} minutes: {label}."), "slots": {"minutes": "small_int", "label": "errand"}},
    {"name": "send_email", "description": "Send an email.", "parameters": {"to": "email address", "subject": "string", "body": "string"},
     "requests": ("Email {to} with the subject '{subject}' and tell them the meeting moved to Friday.", "Send a message to {to} about {subject}."), "slots": {"to": "email", "subject": "subject"}},
    {"name": "create_calendar_event", "description": "Create an event in the user's calendar.", "parameters": {"title": "string", "date": "YYYY-MM-DD", "time": "HH:MM"},
     "requests": ("Put '{title}' in my calendar on {date} at {time}.", "Schedule {title} for {date}, {time}."), "slots": {"title": "subject", "date": "date", "time": "time"}},
    {"name": "get_country_info", "description": "Look up facts about a country.", "parameters": {"country_code": "ISO 3166-1 alpha-2", "fields": "list of strings"},
     "requests": ("Tell me the population and capital of {country}.", "I need basic facts about {country}."), "slots": {"country": "country"}},
    {"name": "translate_text", "description": "Translate text between languages.", "parameters": {"text": "string", "target_language": "ISO 639 code"},
     "requests": ("Translate '{phrase}' into {language}.", "How do you say '{phrase}' in {language}?"), "slots": {"phrase": "phrase", "language": "language"}},
    {"name": "get_time_zone", "description": "Return the current local time in a time zone.", "parameters": {"zone": "IANA time zone name"},
     "requests": ("What time is it in {zone_city} now?", "Current local time for the zone {zone}?"), "slots": {"zone": "zone"}},
    {"name": "book_flight", "description": "Book a flight between two cities.", "parameters": {"origin": "string", "destination": "string", "date": "YYYY-MM-DD", "passengers": "integer"},
     "requests": ("Book a flight from {origin} to {destination} on {date} for {passengers} people.", "I need {passengers} seats from {origin} to {destination}, leaving {date}."), "slots": {"origin": "city", "destination": "city", "date": "date", "passengers": "small_int"}},
    {"name": "install_package", "description": "Install a Debian package on the user's machine.", "parameters": {"package": "string", "assume_yes": "boolean"},
     "requests": ("Install {package} for me without asking questions.", "Please set up the package {package}."), "slots": {"package": "package"}},
    {"name": "calculate", "description": "Evaluate an arithmetic expression.", "parameters": {"expression": "string"},
     "requests": ("What is {a} times {b} plus {c}?", "Compute ({a} + {b}) / {c}."), "slots": {"a": "amount", "b": "small_int", "c": "small_int"}},
    {"name": "find_restaurant", "description": "Find restaurants near a location.", "parameters": {"city": "string", "cuisine": "string", "max_price": "1-4"},
     "requests": ("Find a cheap {cuisine} restaurant in {city}.", "Where can I eat {cuisine} food in {city}?"), "slots": {"city": "city", "cuisine": "cuisine"}},
    {"name": "get_stock_price", "description": "Get the latest price of a stock ticker.", "parameters": {"ticker": "string"},
     "requests": ("What's {ticker} trading at?", "Give me the latest quote for {ticker}."), "slots": {"ticker": "ticker"}},
    {"name": "play_music", "description": "Play music by genre or artist.", "parameters": {"genre": "string", "volume": "0-100"},
     "requests": ("Play some {genre} at volume {volume}.", "I feel like {genre}; put it on."), "slots": {"genre": "genre", "volume": "small_int"}},
    {"name": "create_reminder", "description": "Create a reminder at a given date.", "parameters": {"text": "string", "date": "YYYY-MM-DD"},
     "requests": ("Remind me to {label} on {date}.", "On {date} I must {label}; set a reminder."), "slots": {"label": "errand", "date": "date"}},
    {"name": "get_directions", "description": "Get travel directions between two places.", "parameters": {"origin": "string", "destination": "string", "mode": "driving|walking|transit"},
     "requests": ("How do I get from {origin} to {destination} by {mode}?", "Directions from {origin} to {destination}, {mode} please."), "slots": {"origin": "city", "destination": "city", "mode": "mode"}},
    {"name": "lookup_command", "description": "Show the manual page summary of a shell command.", "parameters": {"command": "string", "section": "integer"},
     "requests": ("What does the {command} command do? Look it up.", "Open the manual for {command}."), "slots": {"command": "command"}},
    {"name": "order_groceries", "description": "Add items to the grocery order.", "parameters": {"items": "list of strings", "delivery_date": "YYYY-MM-DD"},
     "requests": ("Order {food} and {food2} for delivery on {date}.", "Add {food} and {food2} to my groceries for {date}."), "slots": {"food": "food", "food2": "food", "date": "date"}},
    {"name": "get_exchange_history", "description": "Historical exchange rate of a currency pair on a date.", "parameters": {"base": "ISO 4217", "quote": "ISO 4217", "date": "YYYY-MM-DD"},
     "requests": ("What was the {from_currency} to {to_currency} rate on {date}?", "Show the historical rate {from_currency}/{to_currency} for {date}."), "slots": {"from_currency": "currency", "to_currency": "currency", "date": "date"}},
    {"name": "reserve_table", "description": "Reserve a table at a restaurant.", "parameters": {"restaurant": "string", "party_size": "integer", "time": "HH:MM"},
     "requests": ("Reserve a table for {passengers} at {restaurant} at {time}.", "Get us a table at {restaurant}, {passengers} people, {time}."), "slots": {"passengers": "small_int", "restaurant": "restaurant", "time": "time"}},
    {"name": "check_package_version", "description": "Return the version of a Debian package in the archive.", "parameters": {"package": "string", "release": "string"},
     "requests": ("Which version of {package} is in bookworm?", "Check the archive version of {package}."), "slots": {"package": "package"}},
    {"name": "word_definition", "description": "Look up the definition of an English word.", "parameters": {"word": "string"},
     "requests": ("Define the word '{word}'.", "What does '{word}' mean?"), "slots": {"word": "word"}},
    {"name": "unit_convert", "description": "Convert a quantity between units.", "parameters": {"value": "number", "from_unit": "string", "to_unit": "string"},
     "requests": ("Convert {amount} {from_unit} to {to_unit}.", "How many {to_unit} is {amount} {from_unit}?"), "slots": {"amount": "amount", "from_unit": "length_unit", "to_unit": "length_unit"}},
    {"name": "news_headlines", "description": "Fetch the latest news headlines for a topic.", "parameters": {"topic": "string", "country_code": "ISO 3166-1 alpha-2"},
     "requests": ("Any news about {topic} in {country}?", "Show me headlines on {topic} from {country}."), "slots": {"topic": "topic", "country": "country"}},
    {"name": "create_note", "description": "Save a note to the user's notebook.", "parameters": {"title": "string", "content": "string"},
     "requests": ("Make a note titled '{subject}' saying I need to {label}.", "Write down: {label}. Title it {subject}."), "slots": {"subject": "subject", "label": "errand"}},
    {"name": "get_holidays", "description": "List public holidays of a country in a year.", "parameters": {"country_code": "ISO 3166-1 alpha-2", "year": "integer"},
     "requests": ("What are the public holidays in {country} in {year}?", "List {country}'s holidays for {year}."), "slots": {"country": "country", "year": "year"}},
    {"name": "rent_bike", "description": "Rent a city bike at a station.", "parameters": {"city": "string", "hours": "integer"},
     "requests": ("Rent me a bike in {city} for {hours} hours.", "I want a city bike in {city}, {hours} hours."), "slots": {"city": "city", "hours": "small_int"}},
)  # fmt: skip

SLOT_VALUES = {
    "unit": ("celsius", "fahrenheit"),
    "amount": tuple(str(v) for v in (5, 12, 20, 35, 50, 75, 99, 120, 250, 400, 999, 1500, 2024, 3.5, 17.25)),
    "small_int": tuple(str(v) for v in range(2, 13)),
    "software_need": ("editing PDFs", "a music player", "a password manager", "video editing", "checking spelling", "a web server", "backups", "drawing diagrams", "a chess engine", "reading e-books", "monitoring disk usage", "a Markdown editor"),
    "errand": ("call the dentist", "buy milk", "water the plants", "pay the electricity bill", "pick up the kids", "send the report", "renew my passport", "book a haircut", "return the library books", "check the oven"),
    "email": ("anna@example.com", "team@example.org", "j.smith@example.net", "support@example.com", "li.wei@example.org", "omar@example.net"),
    "subject": ("quarterly report", "team lunch", "project kickoff", "budget review", "holiday plans", "server migration", "book club", "product launch"),
    "date": ("2025-01-15", "2025-03-02", "2025-04-30", "2025-06-21", "2025-07-04", "2025-09-09", "2025-11-11", "2025-12-24"),
    "time": ("08:30", "10:00", "12:15", "14:45", "17:00", "19:30", "21:00"),
    "phrase": ("good morning", "where is the train station", "thank you very much", "I am hungry", "how much does it cost", "see you tomorrow"),
    "mode": ("driving", "walking", "transit"),
    "cuisine": ("Italian", "Thai", "Mexican", "Japanese", "Indian", "Ethiopian", "Lebanese", "vegan"),
    "ticker": ("AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "IBM", "SAP", "ASML"),
    "genre": ("jazz", "classical music", "rock", "lo-fi beats", "reggae", "folk", "techno"),
    "food": ("apples", "rice", "eggs", "bread", "tomatoes", "cheese", "coffee beans", "spinach", "oat milk"),
    "restaurant": ("Luigi's", "The Green Fork", "Sakura House", "Casa Lola", "Bistro 21", "Spice Route"),
    "word": ("serendipity", "ephemeral", "ubiquitous", "quixotic", "laconic", "gregarious", "meticulous"),
    "length_unit": ("meters", "feet", "miles", "kilometers", "inches", "centimeters"),
    "year": ("2024", "2025", "2026"),
    "topic": ("elections", "football", "renewable energy", "space", "health", "technology", "the economy"),
}  # fmt: skip
