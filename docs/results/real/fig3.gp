set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/fig3.png'
set title 'fig3: prefill->decode correlation of a request''s expert counts, Llama-4-Maverick-17B-128E-Instruct'
set xlabel ''
set ylabel 'median Pearson (prefill vs decode counts)'
$d0 << EOD
"own request" 0.630762
"random pair" 0.28818
"same-domain pair" 0.436894
EOD
unset key
set style data histograms
set style fill solid 0.6
set boxwidth 0.8
set yrange [0:*]
plot $d0 using 2:xtic(1) title 'median Pearson'
