"""Short texts in every supported language.

They seed the stand-in tokenizers (merges are learned from them) and serve as test sentences:
each exercises its script's letters, diacritics and punctuation.
"""
from __future__ import annotations

SAMPLE_SENTENCES: dict[str, str] = {
    "ar": "الطقس جميل اليوم، وسنذهب معًا إلى الحديقة. مرحبًا، كيف حالك؟ اشترينا ٣ كتب بـ 25 دينارًا.",
    "da": "Vejret er dejligt i dag, og vi går sammen i parken. Hej, hvordan har du det? Æbler, øl og blåbær!",
    "de": "Das Wetter ist heute schön, und wir gehen zusammen in den Park. Hallo, wie geht es dir? Grüße aus München!",
    "el": "Ο καιρός είναι ωραίος σήμερα και θα πάμε μαζί στο πάρκο. Γεια σου, τι κάνεις; Ευχαριστώ πολύ!",
    "en": "The weather is nice today, and we will go to the park together. Hello, how are you? It costs $3.50.",
    "es": "Hace buen tiempo hoy y vamos a ir juntos al parque. ¡Hola! ¿Cómo estás? El niño come piña.",
    "fi": "Sää on tänään kaunis, ja menemme yhdessä puistoon. Hei, mitä kuuluu? Kiitos paljon!",
    "fr": "Il fait beau aujourd'hui et nous irons ensemble au parc. Bonjour, comment ça va ? C'est l'été, où êtes-vous ?",
    "he": "מזג האוויר יפה היום, ונלך יחד לפארק. שלום, מה שלומך? תודה רבה!",
    "hi": "आज मौसम अच्छा है, और हम साथ में पार्क जाएंगे। नमस्ते, आप कैसे हैं? बहुत धन्यवाद!",
    "it": "Oggi il tempo è bello e andremo insieme al parco. Ciao, come stai? Perché no, è così.",
    "ja": "今日は天気が良いので、一緒に公園へ行きます。こんにちは、お元気ですか？コーヒーを飲みましょう。",
    "ko": "오늘은 날씨가 좋아서 함께 공원에 갈 거예요. 안녕하세요, 어떻게 지내세요? 감사합니다!",
    "ms": "Cuaca hari ini cerah, dan kita akan pergi ke taman bersama-sama. Helo, apa khabar? Terima kasih!",
    "nl": "Het weer is vandaag mooi en we gaan samen naar het park. Hallo, hoe gaat het met je? Één café, graag.",
    "no": "Været er fint i dag, og vi skal gå til parken sammen. Hei, hvordan går det? Blåbær og smør!",
    "pl": "Dzisiaj jest ładna pogoda i pójdziemy razem do parku. Cześć, jak się masz? Żółć i źrebię.",
    "pt": "O tempo está bom hoje e vamos juntos ao parque. Olá, como você está? Não, obrigado, coração.",
    "ru": "Сегодня хорошая погода, и мы вместе пойдём в парк. Привет, как дела? Ещё раз спасибо!",
    "sv": "Vädret är fint i dag, och vi går till parken tillsammans. Hej, hur mår du? Åka båt, öl.",
    "sw": "Hali ya hewa ni nzuri leo, na tutaenda pamoja kwenye bustani. Habari, hujambo? Asante sana!",
    "tr": "Bugün hava çok güzel, birlikte parka gideceğiz. Merhaba, nasılsın? Işık, ağaç ve göl.",
    "zh": "今天天气很好，我们一起去公园。你好，你最近怎么样？我是中国人。",
}

# English prose the stand-in GPT-2 merges are learned from.
ENGLISH_PROSE = """\
Chorus turns text into speech. A request arrives with a few sentences, a voice and some options;
the text is cleaned, split into chunks and tokenized, and the model writes speech tokens one at a
time until it decides the sentence is over. The vocoder then turns those tokens into a waveform.
It is a long way from a letter to a sound, and every step has to be fast, because people notice
when a voice assistant hesitates. They also notice when it mispronounces their name, when it
reads numbers like 1,250 or dates like March 3rd, 2024 in a strange way, or when it laughs at the
wrong moment. Good speech synthesis is therefore a matter of many small details: punctuation,
pauses, emphasis, breathing, and the rhythm of the language itself.
The weather was nice that afternoon. We walked to the park together, talked about the book we
were reading, and watched the children playing near the water. Somebody had left a red bicycle
against the old tree, and a dog kept running around it as if it were a new friend. "Isn't it
lovely?" she asked. "It is," I said, "but I think it is going to rain later." We went home before
the first drops fell, made some tea, and listened to the radio for an hour or two.
Numbers, names and abbreviations are the hardest part: Dr. Smith lives at 221B Baker Street,
the meeting starts at 9:30 a.m., and the price went up by 15% in one year. What should a speaker
say for an email address, a web link or a chemical formula? There is no single right answer, so a
system has to pick one and be consistent about it. Questions, exclamations and quotations change
the melody of a sentence; a comma asks for a short pause, a full stop for a longer one.
"""
