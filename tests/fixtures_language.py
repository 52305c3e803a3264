"""Speech in a language XTTS v2 does not speak, for the ``--new-language`` tests: Vietnamese
sentences written for these tests (everyday statements, numbers, punctuation), which
espeak-ng reads with its ``vi`` voice, and Swahili ones (num2words cannot spell Swahili
numbers, so their digits stay and are reported)."""
from __future__ import annotations

from pathlib import Path

from fixtures_prepare import espeak

SENTENCES_VI = [
    "Xin chào, tôi tên là Minh và tôi sống ở Hà Nội.",
    "Hôm nay trời nắng đẹp, chúng ta đi dạo công viên nhé.",
    "Mẹ tôi nấu phở rất ngon vào mỗi sáng chủ nhật.",
    "Con mèo đang ngủ trên ghế cạnh cửa sổ.",
    "Tôi có 3 quyển sách mới và 2 cây bút chì.",
    "Năm 2024, thành phố đã xây thêm nhiều cây cầu.",
    "Anh ấy làm việc ở bệnh viện được mười năm rồi.",
    "Chúng tôi thường uống cà phê sữa đá vào buổi chiều.",
    "Bạn có muốn ăn cơm tối với gia đình tôi không?",
    "Ngày mai tôi phải dậy sớm để đi học tiếng Anh.",
    "Cô giáo đọc một câu chuyện cổ tích cho học sinh.",
    "Những chiếc lá vàng rơi đầy trên con đường nhỏ.",
    "Ông bà tôi sống ở quê, gần một dòng sông lớn.",
    "Tàu hỏa khởi hành lúc 7 giờ sáng từ ga Sài Gòn.",
    "Em gái tôi thích vẽ tranh và chơi đàn dương cầm.",
    "Mùa hè năm nay chúng tôi sẽ đi biển Nha Trang.",
    "Người nông dân đang gặt lúa trên cánh đồng vàng.",
    "Cửa hàng này bán rau tươi và trái cây mỗi ngày.",
    "Tôi đã đọc xong cuốn tiểu thuyết đó trong hai tuần.",
    "Trời mưa to quá, bạn nhớ mang theo áo mưa nhé.",
    "Chiếc xe đạp cũ của bố vẫn còn chạy rất tốt.",
    "Thư viện mở cửa từ tám giờ sáng đến năm giờ chiều.",
    "Các em nhỏ đang chơi đá bóng ngoài sân trường.",
    "Bà ngoại kể cho tôi nghe về tuổi thơ của bà.",
    "Chúng ta cần tiết kiệm nước và bảo vệ môi trường.",
    "Món bánh mì này có thịt, rau thơm và nước sốt.",
    "Tôi muốn học nấu ăn để làm bữa tối cho cả nhà.",
    "Buổi hòa nhạc tối qua thật tuyệt vời và đông vui.",
    "Anh trai tôi vừa mua một chiếc điện thoại mới.",
    "Hãy đóng cửa sổ lại vì ngoài trời đang rất lạnh.",
    "Cây hoa đào trước nhà đã nở vào dịp Tết.",
    "Chúng tôi đi bộ lên đỉnh núi để ngắm mặt trời mọc.",
    "Bác sĩ khuyên tôi nên ngủ đủ giấc và tập thể dục.",
    "Chợ nổi trên sông rất nhộn nhịp vào buổi sáng.",
    "Học sinh chăm chỉ làm bài tập về nhà mỗi tối.",
    "Tôi thích nghe nhạc trong lúc đọc sách ở quán cà phê.",
    "Con đường này dẫn tới một ngôi làng rất yên bình.",
    "Chị ấy đã viết một bức thư dài cho người bạn cũ.",
    "Những ngôi sao lấp lánh trên bầu trời đêm mùa thu.",
    "Gia đình tôi có bốn người: bố, mẹ, em trai và tôi.",
    # characters the eight sentences above hold out of the first thirty-two
    "Chị sĩ quan trả lời: ngày mai trời sẽ có mưa.",
    "Ông họa sĩ vẽ bức tranh về mùa xuân ở quê nhà.",
    "Cậu bé uống một cốc sữa ấm trước khi đi ngủ.",
    "Cụ ông tập thể dục ở công viên mỗi buổi sáng.",
    "Quyển sách này có nhiều thông tin hữu ích: hãy đọc nó.",
]
# the test split of the tokenizer tests: these eight are the held-out text
HELD_OUT_VI = slice(32, 40)

SENTENCES_SW = [
    "Habari za asubuhi, rafiki yangu mpendwa.",
    "Nina paka 3 na mbwa 2 nyumbani kwetu.",
    "Mwalimu anafundisha watoto kusoma na kuandika.",
    "Tutakwenda sokoni kesho asubuhi mapema sana.",
    "Mvua kubwa ilinyesha usiku kucha jana.",
    "Ninapenda kula wali na maharagwe kila siku.",
]


def make_corpus(root: Path, sentences: list[str], voice: str) -> Path:
    """root/metadata.csv (LJSpeech layout) and root/wavs/<id>.wav read by espeak-ng's
    ``voice``, speed and pitch varied; returns the metadata path."""
    wavs = root / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, text in enumerate(sentences):
        key = f"{voice}-{i + 1:04d}"
        espeak(text, wavs / f"{key}.wav", voice, 140 + (i * 13) % 50, 40 + (i * 7) % 30)
        lines.append(f"{key}|{text}|{text}")
    meta = root / "metadata.csv"
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return meta
